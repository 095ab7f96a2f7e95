"""The in-sandbox browser driver (``mode="driver"`` of :mod:`orchard.harness.chromium`).

Run inside a sandbox, next to an uploaded copy of :mod:`orchard.harness.browser_actions`, with the
virtualenv's Python (the sandbox sees it; it does not see the ``orchard`` package)::

    python browser_driver.py --port 9223 --chromium /usr/bin/chromium --flag=--headless ...

It launches Chromium through Playwright and answers on the sandbox's loopback:

``GET /health``            ``{"ok": true}`` once the browser is up
``POST /context``          ``{"width", "height", "device_scale"}``: a fresh context (the previous one closed)
``POST /call``             ``{"name", "arguments"}``: ``{"result", "events"}``, or ``{"failed", "events"}``
                           for an action that could not be carried out; HTTP 500 when the browser failed

Imports nothing from ``orchard``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from aiohttp import web
from browser_actions import ActionFailed, BrowserTabs
from playwright.async_api import async_playwright


class Driver:
    def __init__(self, chromium: str, flags: list[str]) -> None:
        self.chromium, self.flags = chromium, flags
        self.browser: Any = None
        self.tabs: BrowserTabs | None = None
        self.sent = 0
        self.spare: tuple[tuple[int, int, float], asyncio.Future] | None = None  # the next context, made ahead
        self.pending: set[asyncio.Future] = set()

    async def start(self, app: web.Application) -> None:
        self.playwright = await async_playwright().start()
        self.browser = await self.playwright.chromium.launch(executable_path=self.chromium, args=self.flags,
                                                             headless=True)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": self.browser is not None and self.browser.is_connected()})

    async def context(self, request: web.Request) -> web.Response:
        """A fresh context: the one made ahead at the previous request when its settings match (the
        next is made now, in the background), the previous episode's closed in the background."""
        body = await request.json()
        settings = (int(body["width"]), int(body["height"]), float(body.get("device_scale", 1.0)))
        if self.tabs is not None:
            self.background(self.tabs.context.close())
        spare, self.spare = self.spare, None
        if spare is not None and spare[0] == settings:
            tabs = await spare[1]
        else:
            if spare is not None:
                self.background(self.discard(spare[1]))
            tabs = await self.new_tabs(settings)
        self.spare = (settings, asyncio.ensure_future(self.new_tabs(settings)))
        self.tabs, self.sent = tabs, 0
        return web.json_response({"ok": True})

    async def new_tabs(self, settings: tuple[int, int, float]) -> BrowserTabs:
        """A fresh context with its event binding and one blank tab."""
        context = await self.browser.new_context(viewport={"width": settings[0], "height": settings[1]},
                                                 device_scale_factor=settings[2])
        return await BrowserTabs.open(context, settings[:2])

    async def discard(self, pending: asyncio.Future) -> None:
        await (await pending).context.close()

    def background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.pending.add(task)
        task.add_done_callback(lambda done: self.pending.discard(done) or done.cancelled() or done.exception())

    async def call(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.tabs is None:
            return web.json_response({"error": "no context: POST /context first"}, status=409)
        try:
            reply: dict[str, Any] = {"result": await self.tabs.call(body["name"], **body.get("arguments", {}))}
        except ActionFailed as exc:
            if self.tabs.crashed or not self.browser.is_connected():
                return web.json_response({"error": f"the browser failed: {exc}"}, status=500)
            reply = {"failed": str(exc)}
        reply["events"], self.sent = self.tabs.events[self.sent:], len(self.tabs.events)
        return web.json_response(reply)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chromium", required=True)
    parser.add_argument("--flag", action="append", default=[])
    args = parser.parse_args()
    driver = Driver(args.chromium, args.flag)
    app = web.Application(client_max_size=64 << 20)
    app.on_startup.append(driver.start)
    app.add_routes([web.get("/health", driver.health), web.post("/context", driver.context),
                    web.post("/call", driver.call)])
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, loop=asyncio.new_event_loop())


if __name__ == "__main__":
    main()

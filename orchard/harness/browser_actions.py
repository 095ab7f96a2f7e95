"""The browser's atomic actions over one Playwright browser context: the body of the 13 GUI tools.

This module imports nothing from ``orchard`` (only Playwright and the standard library), because
it runs in two places: on the host, over a Chromium in a sandbox reached through the sandbox's
port forward (the default, :mod:`orchard.harness.chromium`), and inside the sandbox, in the
driver process of :mod:`orchard.harness.browser_driver`, where it is uploaded as a file (the
sandbox sees the virtualenv, not the ``orchard`` package).

Every action is ``await tabs.call(name, **arguments)``, which returns a JSON-able result (a short
text for the model, or data for a task) or raises :class:`ActionFailed` with a message for the
model (a valid call that could not be carried out: a tab that does not exist, a navigation that
failed). Coordinates are CSS pixels of the viewport, the same as the pixels of a screenshot, which
is taken at CSS scale (``scale="css"``) whatever the device scale factor.

Pages may report events to the host through ``window.orchardEvent(dict)`` (a binding on every
page of the context): a MiniWoB page ending its episode, a site showing a "verify you are human"
interstitial. They collect in :attr:`BrowserTabs.events`.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from playwright.async_api import BrowserContext, Page
from playwright.async_api import Error as PlaywrightError

# The schemes goto_url and new_tab accept; javascript: (running code) and the browser's own pages are refused.
ALLOWED_SCHEMES = ("http://", "https://", "file://", "about:blank")
ACTION_TIMEOUT_MS = 10_000  # a single navigation or input event; the whole call has its own bound (host side)
EVENT_BINDING = "orchardEvent"

# The visible elements a text-only policy can act on, with their centres (the optional element list).
ELEMENTS_SCRIPT = """(limit) => {
  const selector = 'a, button, input, select, textarea, label, [role=button], [role=link], [role=checkbox], '
    + '[role=tab], [role=option], [onclick], [tabindex], span, td, li, h1, h2, h3, p, div';
  const out = [];
  for (const el of document.querySelectorAll(selector)) {
    const rect = el.getBoundingClientRect();
    if (rect.width < 1 || rect.height < 1 || rect.bottom < 0 || rect.right < 0
        || rect.top > window.innerHeight || rect.left > window.innerWidth) continue;
    const style = window.getComputedStyle(el);
    if (style.visibility === 'hidden' || style.display === 'none') continue;
    const own = Array.from(el.childNodes).filter(n => n.nodeType === 3).map(n => n.textContent).join(' ')
      .replace(/\\s+/g, ' ').trim();
    const interactive = el.matches('a, button, input, select, textarea, label, [role], [onclick], [tabindex]');
    if (!interactive && !own) continue;
    out.push({tag: el.tagName.toLowerCase(), id: el.id || null, text: (own || el.value || el.placeholder || '').slice(0, 80),
              x: Math.round(rect.left + rect.width / 2), y: Math.round(rect.top + rect.height / 2),
              width: Math.round(rect.width), height: Math.round(rect.height)});
    if (out.length >= limit) break;
  }
  return out;
}"""


class ActionFailed(Exception):
    """A valid action the browser could not carry out; its text is shown to the model."""


class BrowserTabs:
    """The tabs of one browser context and the actions on them (see the module docstring).

    ``viewport`` is ``(width, height)`` in CSS pixels. The active tab is the one actions go to;
    pages a page opens itself (``target=_blank``) become new tabs at the end.
    """

    def __init__(self, context: BrowserContext, viewport: tuple[int, int]) -> None:
        self.context, self.viewport = context, viewport
        self.tabs: list[Page] = list(context.pages)
        self.active = 0
        self.events: list[dict[str, Any]] = []
        self.crashed = False  # a page's renderer died (out of memory, killed): the browser is not usable
        context.on("page", self._opened)
        for page in self.tabs:
            page.on("crash", self._crash)

    @classmethod
    async def open(cls, context: BrowserContext, viewport: tuple[int, int]) -> BrowserTabs:
        """Tabs over ``context`` (a fresh one), with the event binding installed and one blank tab."""
        tabs = cls(context, viewport)
        await context.expose_binding(EVENT_BINDING, tabs._event)
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        if not tabs.tabs:
            await context.new_page()
        return tabs

    def _opened(self, page: Page) -> None:
        if page not in self.tabs:
            self.tabs.append(page)
        page.on("close", lambda closed: self._closed(closed))
        page.on("crash", self._crash)

    def _crash(self, page: Page) -> None:
        self.crashed = True

    def _closed(self, page: Page) -> None:
        if page in self.tabs:
            index = self.tabs.index(page)
            self.tabs.remove(page)
            if self.active >= index and self.active > 0:
                self.active -= 1

    def _event(self, source: Any, event: Any) -> None:
        self.events.append(event if isinstance(event, dict) else {"value": event})

    @property
    def page(self) -> Page:
        if not self.tabs:
            raise ActionFailed("there is no open tab; open one with new_tab")
        return self.tabs[self.active]

    async def call(self, name: str, **arguments: Any) -> Any:
        """Run the action ``name``; Playwright's own errors become :class:`ActionFailed`."""
        if self.crashed:
            raise ActionFailed("the page crashed")
        method = getattr(self, f"do_{name}", None)
        if method is None:
            raise ActionFailed(f"unknown browser action {name!r}")
        try:
            return await method(**arguments)
        except PlaywrightError as exc:
            raise ActionFailed(str(exc).splitlines()[0]) from exc

    # -- the 13 tools (done is the harness's: it ends the episode without touching the browser)
    def _inside(self, x: float, y: float) -> None:
        width, height = self.viewport
        if not (0 <= x < width and 0 <= y < height):
            raise ActionFailed(f"({x:g}, {y:g}) is outside the {width}x{height} viewport")

    async def do_click(self, x: float, y: float, button: str = "left", clicks: int = 1) -> str:
        self._inside(x, y)
        await self.page.mouse.click(x, y, button=button, click_count=clicks)
        return f"clicked at ({x:g}, {y:g})"

    async def do_hover(self, x: float, y: float) -> str:
        self._inside(x, y)
        await self.page.mouse.move(x, y)
        return f"hovering at ({x:g}, {y:g})"

    async def do_drag(self, x: float, y: float, to_x: float, to_y: float) -> str:
        self._inside(x, y)
        self._inside(to_x, to_y)
        mouse = self.page.mouse
        await mouse.move(x, y)
        await mouse.down()
        await mouse.move(to_x, to_y, steps=8)
        await mouse.up()
        return f"dragged from ({x:g}, {y:g}) to ({to_x:g}, {to_y:g})"

    async def do_write(self, text: str, x: float | None = None, y: float | None = None, clear: bool = False) -> str:
        if x is not None and y is not None:
            await self.do_click(x, y)
        if clear:
            await self.page.keyboard.press("Control+A")
            await self.page.keyboard.press("Backspace")
        await self.page.keyboard.type(text)
        return f"typed {len(text)} characters"

    async def do_press_keys(self, keys: str) -> str:
        for key in keys.split():  # "Control+A Backspace Enter": one combination after another
            await self.page.keyboard.press(key)
        return f"pressed {keys}"

    async def do_scroll(self, x: float, y: float, delta_x: float = 0, delta_y: float = 0) -> str:
        self._inside(x, y)
        await self.page.mouse.move(x, y)
        await self.page.mouse.wheel(delta_x, delta_y)
        return f"scrolled by ({delta_x:g}, {delta_y:g}) at ({x:g}, {y:g})"

    async def do_goto_url(self, url: str) -> str:
        _check_url(url)
        response = await self.page.goto(url, wait_until="load")
        if response is not None and response.status >= 400:
            return f"opened {url}: the server answered {response.status}"
        return f"opened {url}"

    async def do_go_back(self) -> str:
        # "commit", not "load": a page restored from the back-forward cache fires no load event
        if await self.page.go_back(wait_until="commit") is None:
            return "there is no earlier page in this tab"
        await self.page.wait_for_load_state("domcontentloaded")
        return f"went back to {self.page.url}"

    async def do_wait(self, seconds: float = 1.0) -> str:
        await asyncio.sleep(seconds)
        return f"waited {seconds:g} s"

    async def do_new_tab(self, url: str | None = None) -> str:
        if url is not None:
            _check_url(url)
        page = await self.context.new_page()
        self.active = self.tabs.index(page)
        if url is not None:
            await page.goto(url, wait_until="load")
        return f"opened tab {self.active}" + (f" at {url}" if url else "")

    async def do_switch_tab(self, index: int) -> str:
        self._tab(index)
        self.active = index
        await self.page.bring_to_front()
        return f"switched to tab {index}"

    async def do_close_tab(self, index: int | None = None) -> str:
        index = self.active if index is None else index
        self._tab(index)
        await self.tabs[index].close()  # the close handler updates the list and the active tab
        return f"closed tab {index}" + (f"; tab {self.active} is active" if self.tabs else "; no tab is open")

    def _tab(self, index: int) -> None:
        if not 0 <= index < len(self.tabs):
            raise ActionFailed(f"there is no tab {index}; the open tabs are 0..{len(self.tabs) - 1}")

    # -- what the observation and the tasks read
    async def do_screenshot(self) -> str:
        """The active tab's viewport as a base64 PNG, at CSS scale (image pixels are click coordinates)."""
        png = await self.page.screenshot(scale="css", type="png", animations="disabled", caret="initial")
        return base64.b64encode(png).decode()

    async def do_tab_summary(self) -> list[dict[str, Any]]:
        return [{"index": i, "title": await page.title(), "url": page.url, "active": i == self.active}
                for i, page in enumerate(self.tabs)]

    async def do_elements(self, limit: int = 60) -> list[dict[str, Any]]:
        return await self.page.evaluate(ELEMENTS_SCRIPT, limit)

    async def do_evaluate(self, script: str, argument: Any = None) -> Any:
        """Run a task's script in the active page (tasks and oracles only: no tool exposes it)."""
        return await self.page.evaluate(script, argument)

    async def do_events(self) -> list[dict[str, Any]]:
        return list(self.events)


def _check_url(url: str) -> None:
    if not url.startswith(ALLOWED_SCHEMES):
        raise ActionFailed(f"cannot open {url!r}: only http, https and file URLs are allowed")

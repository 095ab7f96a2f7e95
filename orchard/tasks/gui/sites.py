"""Local multi-page sites for what MiniWoB never exercises: navigation, tabs, a final answer, and a
site that blocks the agent.

A site is generated from a seed (a shop's products, prices, stock and orders), written as static
files, uploaded into the sandbox and served there on its own loopback (``http://127.0.0.1:8000``) by
Python's ``http.server``, so ``network="none"`` sandboxes work. The templated intents:

============  ========================================================================  ============================
kind          intent                                                                    needs
============  ========================================================================  ============================
``price``     the price of a product                                                    click, done(response)
``go_back``   one product's stock, then (back on the list: product pages have no link   click, go_back, done
              back) another's price
``goto_url``  the status of an order, on a page the shop links nowhere (its URL is in   goto_url, done
              the intent)
``tabs``      open two products in new tabs, compare, close them, answer the cheaper    new_tab, switch_tab,
                                                                                        close_tab, done
``captcha``   the support phone number, behind a "verify you are human" page that       (blocked: reward ``None``)
              never lets anyone through (the paper's captcha-blocked sites)
============  ========================================================================  ============================

The answer is computed on the host from the site's data and kept in the task (the policy never sees
it); the rule judge compares the final ``done(response)`` with it, and for ``tabs`` also that one
tab is left open. The interstitial reports itself through the page event binding, so the judge
says ``blocked`` whatever the policy answers.

``tools.html`` holds one control for each remaining tool (a hover menu, a drag slider, a long page
to scroll, a text field submitted with a key, a button that appears after a delay): it is what the
tests drive every one of the 13 tools on.
"""

from __future__ import annotations

import html
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Literal

from orchard.data.trajectory import Outcome, Trajectory
from orchard.env.client import AsyncSandbox
from orchard.harness.chromium import (
    BrowserError,
    BrowserSettings,
    SandboxBrowser,
    browser_of,
    episode_browser,
)
from orchard.harness.task import TaskFamily
from orchard.seeds import seeded_random
from orchard.tasks.gui.family import browser_family
from orchard.tasks.gui.judges import RewardSettings, RuleJudge, gui_outcome

SiteKind = Literal["price", "go_back", "goto_url", "tabs", "captcha"]
KINDS: tuple[SiteKind, ...] = ("price", "go_back", "goto_url", "tabs", "captcha")
PORT = 8000
ORIGIN = f"http://127.0.0.1:{PORT}"
SITE_DIR = "/tmp/orchard-site"
VIEWPORT = (480, 360)

ADJECTIVES = ("Red", "Blue", "Green", "Copper", "Walnut", "Steel", "Linen", "Amber", "Slate", "Olive")
THINGS = ("Kettle", "Lamp", "Teapot", "Backpack", "Notebook", "Blanket", "Mug", "Clock", "Vase", "Stool")
STATUSES = ("shipped", "packed", "delayed", "delivered", "cancelled")

PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font:14px sans-serif;margin:12px}} a{{color:#0645ad}} td,th{{padding:2px 8px;text-align:left}}</style>
</head><body>{body}</body></html>"""

INTERSTITIAL_BODY = """<h1>Verify you are human</h1>
<p>This site needs to check that you are not a robot before you continue.</p>
<label><input type="checkbox" id="human"> I am human</label>
<p id="status"></p>
<script>
window.orchardEvent && window.orchardEvent({type: 'blocked', url: location.href});
document.getElementById('human').addEventListener('change', function () {
  var box = this;
  setTimeout(function () { box.checked = false;
    document.getElementById('status').textContent = 'Verification failed. Please try again.'; }, 300);
});
</script>"""

TOOLS_BODY = """<h1>Tool check</h1>
<div id="menu" style="display:inline-block;padding:4px;border:1px solid #888">More
  <div id="hidden" style="display:none"><a href="#" id="reveal">Newsletter</a></div></div>
<script>
var menu = document.getElementById('menu');
menu.addEventListener('mouseenter', function () { document.getElementById('hidden').style.display = 'block';
  document.body.dataset.hovered = 'yes'; });
</script>
<p><input type="range" id="slider" min="0" max="100" value="0" style="width:200px"></p>
<p><input type="text" id="field" placeholder="type here">
<script>
document.getElementById('field').addEventListener('keydown', function (e) {
  if (e.key === 'Enter') document.body.dataset.submitted = this.value; });
</script></p>
<p id="late"></p>
<script>setTimeout(function () { var b = document.createElement('button'); b.id = 'later'; b.textContent = 'Ready';
  document.getElementById('late').appendChild(b); }, 1500);</script>
<div style="height:1500px"></div>
<p id="bottom">The end of the page.</p>"""


def _page(title: str, body: str) -> str:
    return PAGE.format(title=html.escape(title), body=body)


@dataclass(frozen=True)
class Shop:
    """A shop generated from a seed: products (name, slug, price in cents, stock) and orders."""

    products: tuple[tuple[str, str, int, int], ...]
    orders: tuple[tuple[int, str], ...]
    phone: str

    @classmethod
    def generate(cls, seed: int) -> Shop:
        rng = seeded_random(seed, "gui-shop")
        names = rng.sample([f"{a} {t}" for a in ADJECTIVES for t in THINGS], 6)
        prices = rng.sample(range(500, 9900, 25), 6)  # distinct: "the cheaper" always has one answer
        products = tuple((name, name.lower().replace(" ", "-"), price, rng.randrange(0, 40))
                         for name, price in zip(names, prices, strict=True))
        orders = tuple((number, rng.choice(STATUSES)) for number in rng.sample(range(1000, 9999), 5))
        phone = f"+1 555 {rng.randrange(100, 999)} {rng.randrange(1000, 9999)}"
        return cls(products, orders, phone)

    def files(self) -> dict[str, str]:
        """The site's files by path."""
        items = "".join(f'<li><a href="/product/{slug}.html">{html.escape(name)}</a> '
                        f'<small>({ORIGIN}/product/{slug}.html)</small></li>'
                        for name, slug, _, _ in self.products)
        files = {"index.html": _page("Orchard Supply", f"<h1>Orchard Supply</h1><ul>{items}</ul>"
                                     '<p><a href="/help/index.html">Help</a></p>')}
        for name, slug, price, stock in self.products:
            files[f"product/{slug}.html"] = _page(name, f"<h1>{html.escape(name)}</h1><p>Price: {price_text(price)}</p>"
                                                        f"<p>In stock: {stock}</p>")
        rows = "".join(f"<tr><td>#{number}</td><td>{status}</td></tr>" for number, status in self.orders)
        files["orders.html"] = _page("Orders", f"<h1>Orders</h1><table><tr><th>Order</th><th>Status</th></tr>{rows}</table>")
        files["help/index.html"] = _page("Help", '<h1>Help</h1><p><a href="/help/verify.html">Contact support</a></p>')
        files["help/verify.html"] = _page("Verify you are human", INTERSTITIAL_BODY)
        files["help/contact.html"] = _page("Contact", f"<h1>Contact</h1><p>Phone: {self.phone}</p>")
        files["tools.html"] = _page("Tool check", TOOLS_BODY)
        return files


def price_text(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


FAMILY = browser_family("gui-sites")


@dataclass(frozen=True)
class SiteTask:
    """One intent on one generated shop (see the module docstring). Implements
    :class:`~orchard.harness.task.Task` and the oracle's :class:`~orchard.tasks.gui.oracle.OracleTask`."""

    kind: SiteKind
    seed: int
    browser: BrowserSettings = field(default_factory=lambda: BrowserSettings(viewport=VIEWPORT))
    reward: RewardSettings = field(default_factory=RewardSettings)
    family: TaskFamily = FAMILY

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown site task kind {self.kind!r}; the kinds are {', '.join(KINDS)}")

    @property
    def shop(self) -> Shop:
        return Shop.generate(self.seed)

    @property
    def id(self) -> str:
        return f"site/{self.kind}/{self.seed}"

    @property
    def site(self) -> str:
        return f"site/{self.kind}"

    def _picks(self) -> tuple[tuple[str, str, int, int], tuple[str, str, int, int], tuple[int, str]]:
        rng = seeded_random(self.seed, "gui-intent", self.kind)
        first, second = rng.sample(self.shop.products, 2)
        return first, second, rng.choice(self.shop.orders)

    @property
    def prompt(self) -> str:
        first, second, order = self._picks()
        return {
            "price": f"What is the price of the {first[0]}? Answer with the price as the shop shows it.",
            "go_back": (f"How many {first[0]} are in stock, and what does the {second[0]} cost? Answer as "
                        "'<stock>, <price>', e.g. '7, $12.50'."),
            "goto_url": (f"The shop's order status page is {ORIGIN}/orders.html. What is the status of order "
                         f"#{order[0]}? Answer with the status word."),
            "tabs": (f"Open the {first[0]} and the {second[0]} each in a new tab and compare their prices. Then "
                     "close both product tabs, so that only the shop's list is open, and answer with the name of "
                     "the cheaper product."),
            "captcha": "Find the phone number of the shop's support on its contact page.",
        }[self.kind]

    @property
    def answer(self) -> str:
        first, second, order = self._picks()
        return {"price": price_text(first[2]), "go_back": f"{first[3]}, {price_text(second[2])}",
                "goto_url": order[1], "tabs": min(first, second, key=lambda p: p[2])[0],
                "captcha": self.shop.phone}[self.kind]

    async def setup(self, sandbox: AsyncSandbox) -> None:
        await serve_site(sandbox, self.shop)
        browser = await episode_browser(sandbox, self.browser)
        await browser.call("goto_url", url=f"{ORIGIN}/index.html")

    def settled(self, trajectory: Trajectory) -> Outcome | None:
        return None

    async def grade(self, sandbox: AsyncSandbox, trajectory: Trajectory) -> Outcome:
        browser = browser_of(sandbox)
        tabs = await browser.call("tab_summary")
        judgement = RuleJudge().judge_answer(browser.events, trajectory.metadata.get("submission"), self.answer,
                                             open_tabs=len(tabs), tabs_expected=1 if self.kind == "tabs" else None)
        return gui_outcome(trajectory, judgement, self.reward)

    # -- the oracle's plan
    async def next_action(self, browser: SandboxBrowser, memory: dict[str, Any]) -> dict[str, Any] | None:
        first, second, _ = self._picks()
        tabs = await browser.call("tab_summary")
        url = next(tab["url"] for tab in tabs if tab["active"])
        step = memory.setdefault("step", 0)
        memory["step"] = step + 1
        if self.kind == "price":
            return (await _click_link(browser, first[0])) if step == 0 else _done(self.answer)
        if self.kind == "go_back":
            if step == 1:
                return {"tool": "go_back", "args": {}}
            return _done(self.answer) if step > 2 else await _click_link(browser, (first, None, second)[step][0])
        if self.kind == "goto_url":
            return {"tool": "goto_url", "args": {"url": f"{ORIGIN}/orders.html"}} if step == 0 else _done(self.answer)
        if self.kind == "tabs":
            plan = [{"tool": "new_tab", "args": {"url": f"{ORIGIN}/product/{first[1]}.html"}},
                    {"tool": "new_tab", "args": {"url": f"{ORIGIN}/product/{second[1]}.html"}},
                    {"tool": "switch_tab", "args": {"index": 1}}, {"tool": "close_tab", "args": {"index": 2}},
                    {"tool": "close_tab", "args": {}}, _done(self.answer)]
            return plan[min(step, len(plan) - 1)]
        if "/help/verify" in url:  # captcha: tick the box, wait, see it fail, give up
            memory["tries"] = tries = memory.get("tries", 0) + 1
            if tries == 1:
                return await _click_selector(browser, "#human")
            return {"tool": "wait", "args": {"seconds": 0.5}} if tries == 2 else _done("The site would not let me in.")
        return await _click_link(browser, "Contact support" if "/help/" in url else "Help")

    def wrong_action(self, rng: random.Random, viewport: tuple[int, int]) -> dict[str, Any]:
        return _done(rng.choice([p[0] for p in self.shop.products] + ["I do not know"]))


def _done(response: str) -> dict[str, Any]:
    return {"tool": "done", "args": {"response": response}}


CENTRE_OF = """([selector, text]) => {
  const el = Array.from(document.querySelectorAll(selector)).find(e => text === null || e.textContent.trim() === text);
  if (!el) return null;
  el.scrollIntoView({block: 'center'});
  const r = el.getBoundingClientRect();
  return {x: Math.round(r.left + r.width / 2), y: Math.round(r.top + r.height / 2)};
}"""


async def _click_selector(browser: SandboxBrowser, selector: str, text: str | None = None) -> dict[str, Any]:
    centre = await browser.call("evaluate", script=CENTRE_OF, argument=[selector, text])
    if centre is None:
        raise BrowserError(f"the oracle found no {selector} {text or ''} on the page")
    return {"tool": "click", "args": centre}


async def _click_link(browser: SandboxBrowser, text: str) -> dict[str, Any]:
    return await _click_selector(browser, "a", text)


async def serve_site(sandbox: AsyncSandbox, shop: Shop) -> None:
    """Write the shop's files into the sandbox and serve them on its loopback (once per sandbox)."""
    with tempfile.TemporaryDirectory(prefix="orchard-site-") as local:
        for path, text in shop.files().items():
            os.makedirs(os.path.dirname(os.path.join(local, path)), exist_ok=True)
            with open(os.path.join(local, path), "w", encoding="utf-8") as handle:
                handle.write(text)
        if await sandbox.exists(SITE_DIR):
            await sandbox.exec(["rm", "-rf", SITE_DIR])
        await sandbox.upload_dir(local, SITE_DIR)
    running = [p for p in await sandbox.processes() if p.name == "site-server" and p.running]
    if not running:
        await sandbox.start_process([sys.executable, "-m", "http.server", str(PORT), "--bind", "127.0.0.1",
                                     "--directory", SITE_DIR], name="site-server")
        for _ in range(100):
            probe = await sandbox.exec([sys.executable, "-c", f"import urllib.request as u; u.urlopen('{ORIGIN}/index.html')"])
            if probe.ok:
                return
        raise BrowserError(f"the site server did not start: {probe.stderr[-300:]}")

"""The browser harness on real Chromium in a real sandbox, over the local shop site: the 13 tools,
clicks at coordinates read from screenshots, format errors, images by hash, and a browser that
crashes or hangs mid-episode (a dropped rollout)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal

import numpy as np
import pytest
from PIL import Image

from orchard.data.chat import make_chat_format
from orchard.data.examples import latest_images
from orchard.data.images import ImageStore
from orchard.data.trajectory import Message, ToolCall
from orchard.harness.browser import MARK_TOOLS, STALE_MARK, TOOL_NAMES, TOOLS, BrowserHarness, screenshots
from orchard.harness.chromium import BrowserError, BrowserSettings, SandboxBrowser, browser_of
from orchard.harness.core import FormatError, Limits, Turn, run_agent
from orchard.harness.episode import run_episode
from orchard.harness.policies import EnginePolicy, OpenAIChatPolicy
from orchard.harness.task import FunctionTask, TaskFamily
from orchard.rollout.types import SamplingParams
from orchard.tasks.gui.sites import ORIGIN, SiteTask
from tests.conftest import require_root
from tests.harness.scripted import ScriptedEngine

GUI_SANDBOX = {"memory": "2Gi", "pids": 1024, "network": "none"}


@pytest.fixture(scope="module")
def shop(client):
    """A sandbox with Chromium started in it and the shop site served (the ``price`` task's set-up)."""
    require_root()
    with client.create(**GUI_SANDBOX) as sb:
        task = SiteTask("price", 3)
        sb.run_async(task.setup)
        yield sb, task


def act(sb, harness: BrowserHarness, name: str, **arguments):
    """One tool call through the harness, as the core runs it."""
    call = ToolCall(id="call_1", name=name, arguments=arguments)
    harness.parse(Turn(Message(role="assistant", tool_calls=[call])))
    return sb.run_async(lambda box: harness.execute(call, box))


def page(sb, script: str, argument=None):
    return sb.run_async(lambda box: browser_of(box).call("evaluate", script=script, argument=argument))


def test_the_thirteen_tools_are_the_papers():
    assert TOOL_NAMES == ("click", "hover", "drag", "write", "press_keys", "scroll", "goto_url", "go_back", "wait",
                          "new_tab", "switch_tab", "close_tab", "done")
    assert all(tool["type"] == "function" and tool["function"]["parameters"]["type"] == "object" for tool in TOOLS)


def test_a_click_at_a_target_found_in_the_screenshot_hits_it(client):
    """At device scale 2 the screenshot is still CSS-sized, so a pixel found in it is a click coordinate."""
    require_root()
    with client.create(**GUI_SANDBOX) as sb:
        settings = BrowserSettings(viewport=(300, 200), device_scale=2.0)

        async def prepare(box):
            browser = await SandboxBrowser.start(box, settings)
            await browser.new_episode()
            await browser.call("evaluate", script="""() => { document.body.innerHTML =
              '<div id=t style="position:absolute;left:203px;top:117px;width:14px;height:10px;background:#f00"></div>';
              document.getElementById('t').onclick = (e) => { document.body.dataset.hit = e.clientX + ',' + e.clientY; }; }""")

        sb.run_async(prepare)
        harness = BrowserHarness()
        shown = sb.run_async(harness.page_message, "")
        image = Image.open(io.BytesIO(harness.images.read(shown.images[0]))).convert("RGB")
        assert image.size == (300, 200) == (shown.images[0].width, shown.images[0].height)
        red = [(x, y) for x in range(300) for y in range(200) if image.getpixel((x, y)) == (255, 0, 0)]
        x = sum(p[0] for p in red) / len(red)
        y = sum(p[1] for p in red) / len(red)
        assert (round(x), round(y)) == (210, 122)  # the square's centre, as the page laid it out
        act(sb, harness, "click", x=x, y=y)
        hit_x, hit_y = map(int, page(sb, "() => document.body.dataset.hit").split(","))  # set only by a hit
        assert 203 <= hit_x < 217 and 117 <= hit_y < 127


def test_every_tool_acts_on_the_local_site(shop):
    sb, task = shop
    harness = BrowserHarness()
    sb.run_async(task.setup)  # a fresh context on the shop's list
    first = task.shop.products[0]
    link = page(sb, """(name) => { const a = Array.from(document.querySelectorAll('a')).find(e => e.textContent === name);
                        const r = a.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; }""",
                first[0])
    act(sb, harness, "click", x=link[0], y=link[1])
    assert page(sb, "() => location.pathname") == f"/product/{first[1]}.html"
    act(sb, harness, "go_back")
    assert page(sb, "() => location.pathname") == "/index.html"
    act(sb, harness, "goto_url", url=f"{ORIGIN}/tools.html")
    menu = page(sb, "() => { const r = document.getElementById('menu').getBoundingClientRect(); "
                    "return [r.left + 5, r.top + 5]; }")
    act(sb, harness, "hover", x=menu[0], y=menu[1])
    assert page(sb, "() => document.body.dataset.hovered") == "yes"
    track = page(sb, "() => { const r = document.getElementById('slider').getBoundingClientRect(); "
                     "return [r.left + 3, r.top + r.height / 2, r.right - 3]; }")
    act(sb, harness, "drag", x=track[0], y=track[1], to_x=(track[0] + track[2]) / 2, to_y=track[1])
    assert 30 <= int(page(sb, "() => document.getElementById('slider').value")) <= 70
    field = page(sb, "() => { const r = document.getElementById('field').getBoundingClientRect(); "
                     "return [r.left + 5, r.top + 5]; }")
    act(sb, harness, "write", text="hello there", x=field[0], y=field[1])
    act(sb, harness, "press_keys", keys="Control+A Backspace")
    act(sb, harness, "write", text="orchard")
    act(sb, harness, "press_keys", keys="Enter")
    assert page(sb, "() => document.body.dataset.submitted") == "orchard"
    act(sb, harness, "scroll", x=100, y=100, delta_y=600)
    assert page(sb, "() => window.scrollY") > 0
    observation = act(sb, harness, "wait", seconds=2)  # the page adds a button 1.5 s after it loads
    assert observation.message.content == "waited 2 s"
    assert page(sb, "() => document.getElementById('later').textContent") == "Ready"
    act(sb, harness, "new_tab", url=f"{ORIGIN}/orders.html")
    act(sb, harness, "new_tab")
    tabs = sb.run_async(lambda box: browser_of(box).call("tab_summary"))
    assert [t["url"] for t in tabs] == [f"{ORIGIN}/tools.html", f"{ORIGIN}/orders.html", "about:blank"]
    assert tabs[2]["active"]
    act(sb, harness, "switch_tab", index=1)
    assert page(sb, "() => location.pathname") == "/orders.html"
    observation = act(sb, harness, "close_tab", index=2)
    assert "closed tab 2" in observation.message.content and "[1] Orders" in observation.then[0].content
    act(sb, harness, "close_tab")
    assert [t["url"] for t in sb.run_async(lambda box: browser_of(box).call("tab_summary"))] == [f"{ORIGIN}/tools.html"]
    done = act(sb, harness, "done", response="$12.00")
    assert done.submission == "$12.00"


def test_bad_calls_are_format_errors_and_failed_calls_are_observations(shop):
    sb, task = shop
    harness = BrowserHarness()
    sb.run_async(task.setup)

    def rejected(*calls: ToolCall, errors=(), content="") -> str:
        with pytest.raises(FormatError) as caught:
            harness.parse(Turn(Message(role="assistant", content=content, tool_calls=list(calls)), errors=list(errors)))
        return str(caught.value)

    assert "did not call a tool" in rejected()
    assert "could not be parsed" in rejected(content="<tool_call>{click}</tool_call>")
    assert "could not be parsed" in rejected(errors=["not JSON"])
    assert "exactly one tool" in rejected(ToolCall(name="wait", arguments={}), ToolCall(name="wait", arguments={}))
    assert "no tool named 'type'" in rejected(ToolCall(name="type", arguments={"text": "a"}))
    assert "missing required parameter(s): y" in rejected(ToolCall(name="click", arguments={"x": 3}))
    assert "must be of type number" in rejected(ToolCall(name="click", arguments={"x": "3", "y": 4}))
    assert "unknown parameter(s): z" in rejected(ToolCall(name="hover", arguments={"x": 3, "y": 4, "z": 1}))
    assert "must be one of" in rejected(ToolCall(name="click", arguments={"x": 3, "y": 4, "button": "side"}))
    for name, arguments, error in (("switch_tab", {"index": 5}, "there is no tab 5"),
                                   ("close_tab", {"index": -1}, "there is no tab -1"),
                                   ("goto_url", {"url": "javascript:alert(1)"}, "only http, https and file"),
                                   ("click", {"x": 900, "y": 10}, "outside the 480x360 viewport"),
                                   ("goto_url", {"url": "http://127.0.0.1:8001/"}, "ERR_CONNECTION_REFUSED")):
        observation = act(sb, harness, name, **arguments)
        assert observation.message.content.startswith("ERROR:") and error in observation.message.content
        assert observation.submission is None and observation.then  # the run goes on, with a new screenshot


def test_marks_name_the_listed_elements_and_a_stale_mark_is_a_clear_tool_error(shop):
    sb, task = shop
    harness = BrowserHarness(marks=True)
    assert harness.name == "browser-marks" and [t["function"]["name"] for t in harness.tools] == [
        "click_mark", "type_mark", "press_keys", "done"]
    assert len(json.dumps(MARK_TOOLS)) * 3 < len(json.dumps(TOOLS))  # a compact schema for small policies
    sb.run_async(task.setup)
    first = task.shop.products[0]

    def marks(message: Message) -> dict[str, int]:
        """Each listed element's text (and its tag#id) -> its mark."""
        listed = [line.split(" ", 2) for line in message.content.splitlines() if line.startswith("[")]
        return {key: int(mark[1:-1]) for mark, tag, text in listed for key in (json.loads(text), tag)}

    [opening] = sb.run_async(harness.opening)
    shown = marks(opening)
    assert opening.images and first[0] in shown
    observation = act(sb, harness, "click_mark", mark=shown[first[0]])
    assert page(sb, "() => location.pathname") == f"/product/{first[1]}.html"  # the mark's element was clicked
    assert marks(observation.then[0]) != shown  # a new page, a new list
    act(sb, harness, "press_keys", keys="Alt+ArrowLeft")
    sb.run_async(lambda box: browser_of(box).call("goto_url", url=f"{ORIGIN}/tools.html"))
    tools_page = marks(sb.run_async(harness.page_message, ""))
    act(sb, harness, "type_mark", mark=tools_page["input#field"], text="orchard")
    act(sb, harness, "press_keys", keys="Enter")
    assert page(sb, "() => document.body.dataset.submitted") == "orchard"
    unknown = max(tools_page.values()) + 7
    stale = act(sb, harness, "type_mark", mark=unknown, text="x")
    assert stale.message.content == STALE_MARK.format(mark=unknown) and stale.then and stale.submission is None
    assert page(sb, "() => document.body.dataset.submitted") == "orchard"  # nothing was typed anywhere
    with pytest.raises(FormatError, match="must be of type integer"):
        harness.parse(Turn(Message(role="assistant", tool_calls=[ToolCall(name="click_mark",
                                                                           arguments={"mark": "3"})])))


@pytest.mark.parametrize("vision", [False, True], ids=["text", "vision"])
def test_a_qwen3_policy_solves_a_site_task_and_images_are_kept_by_hash(shop, tokenizer, chat_format, tmp_path, vision):
    """<think> and <tool_call> as the model writes them, parsed by the project's Qwen3 format. A text
    policy's prompts show no screenshot; a vision policy's (``qwen3_vl``, the paper's k = 1) show the
    latest one as placeholders, and its engine gets that screenshot's pixels."""
    sb, task = shop
    sb.run_async(task.setup)
    product = next(p for p in task.shop.products if p[0] in task.prompt)
    link = page(sb, """(name) => { const a = Array.from(document.querySelectorAll('a')).find(e => e.textContent === name);
                        const r = a.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; }""",
                product[0])
    replies = [
        "<think>\nThe list shows the product; I open its page.\n</think>\n\n<tool_call>\n"
        + json.dumps({"name": "click", "arguments": {"x": link[0], "y": link[1]}}) + "\n</tool_call>",
        "<think>\nThe price is on the page.\n</think>\n\n<tool_call>\n"
        + json.dumps({"name": "done", "arguments": {"response": task.answer}}) + "\n</tool_call>"]
    engine, store = ScriptedEngine(tokenizer, replies), ImageStore(tmp_path)
    per_image = 12  # placeholders per screenshot, whatever its size, for this check
    fmt = make_chat_format("qwen3_vl", tokenizer, lambda w, h: per_image) if vision else chat_format
    policy = EnginePolicy(engine, fmt, SamplingParams(max_tokens=200), view=latest_images(1 if vision else 0),
                          images=store if vision else None)
    harness = BrowserHarness(images=store)
    trajectory = sb.run_async(lambda box: run_agent(harness, policy, box, task.prompt, limits=Limits(max_turns=5)))
    assert trajectory.metadata["end_reason"] == "submitted" and trajectory.metadata["submission"] == task.answer
    assert sb.run_async(task.grade, trajectory).reward == 1.0
    assert trajectory.messages[2].images and trajectory.messages[0].role == "system"  # the first screenshot
    line = trajectory.model_dump_json()
    assert "base64" not in line and "iVBOR" not in line  # no PNG inside the JSON line
    shots = screenshots(trajectory, tmp_path)
    assert len(shots) == 2 and all(shot.startswith(b"\x89PNG") for shot in shots)
    assert len(os.listdir(tmp_path)) >= 1
    pad, start_id, end_id = (tokenizer.token_id(t) for t in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>"))
    assert [prompt.count(pad) for prompt in engine.prompts] == ([per_image] * 2 if vision else [0, 0])
    if vision:  # the latest screenshot, decoded, at CSS pixels (the viewport's size)
        latest = [next(m for m in reversed(trajectory.messages[:i]) if m.images).images[-1]
                  for i, m in enumerate(trajectory.messages) if m.role == "assistant"]
        for (row,), ref, prompt in zip(engine.images, latest, engine.prompts, strict=True):
            [(pixels, start)] = row
            assert pixels.shape == (ref.height, ref.width, 3) == (360, 480, 3)
            np.testing.assert_array_equal(pixels, store.pixels(ref))
            assert prompt[start - 1:start + per_image + 1] == [start_id] + [pad] * per_image + [end_id]
    else:
        assert engine.images == [[], []]


class _KillingPolicy:
    """Clicks; before its second turn it kills the browser (or stops it, for a hang)."""

    name = "killer"

    def __init__(self, sig: int) -> None:
        self.sig = sig

    async def act(self, conversation, *, max_context=None):
        turns = sum(m.role == "assistant" for m in conversation.messages)
        if turns == 1:
            browser = browser_of(conversation.sandbox)
            await conversation.sandbox.kill_process(browser.process_id, signal=self.sig)
            await asyncio.sleep(0.5)
        return Turn(Message(role="assistant", tool_calls=[ToolCall(id=f"c{turns}", name="click",
                                                                   arguments={"x": 5, "y": 5})]))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["crash", "hang"])
async def test_a_browser_that_dies_or_hangs_mid_episode_is_a_dropped_rollout(aclient, sig):
    require_root()
    task = SiteTask("price", 0, browser=BrowserSettings(viewport=(480, 360), call_timeout=4.0))
    trajectory = await run_episode(aclient, BrowserHarness(), _KillingPolicy(sig), task, limits=Limits(max_turns=4))
    assert trajectory.outcome.status == "aborted" and trajectory.outcome.reward is None
    assert trajectory.metadata["end_reason"] == "sandbox_error"
    assert "BrowserError" in trajectory.metadata["error"]
    assert ("hung" if sig == signal.SIGSTOP else "went away") in trajectory.metadata["error"]
    assert trajectory.metadata["steps"] == 2


HOG_PAGE = """() => { document.body.innerHTML = '<button style="width:300px;height:200px">hog</button>';
  document.querySelector('button').onclick = () => {
    window.hog = []; for (let i = 0; i < 100000; i++) window.hog.push(new Array(1e6).fill(i)); }; }"""


async def test_a_browser_out_of_memory_is_a_dropped_rollout(aclient):
    """A page that eats memory in a 600 MiB sandbox: its renderer dies, and the rollout is dropped."""
    require_root()
    settings = BrowserSettings(viewport=(300, 200), call_timeout=20.0)

    async def setup(box):
        browser = await SandboxBrowser.start(box, settings)
        await browser.new_episode()
        await browser.call("evaluate", script=HOG_PAGE)

    family = TaskFamily("hog", sandbox={"memory": "600Mi", "pids": 1024, "network": "none"})
    task = FunctionTask("hog", "Press the button.", setup, family=family)
    policy = _Clicks()
    trajectory = await run_episode(aclient, BrowserHarness(), policy, task, limits=Limits(max_turns=3))
    assert (trajectory.outcome.status, trajectory.outcome.reward) == ("aborted", None)
    assert "renderer crashed during click" in trajectory.metadata["error"]


class _Clicks:
    name = "clicks"

    async def act(self, conversation, *, max_context=None):
        return Turn(Message(role="assistant", tool_calls=[ToolCall(id="c", name="click", arguments={"x": 50, "y": 50})]))


def test_no_browser_in_a_sandbox_is_a_clear_error(sandbox):
    with pytest.raises(BrowserError, match="no browser was started"):
        sandbox.run_async(browser_of)


async def test_a_chat_policy_sends_only_the_latest_screenshot(aclient, scripted_chat, tmp_path):
    """Over an OpenAI-compatible endpoint, a browser episode sends the last k = 1 screenshots as
    image parts of user messages, and tool calls come back as the tools' answers."""
    require_root()
    task = SiteTask("goto_url", 5)
    scripted_chat.replies += [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": {
            "name": "goto_url", "arguments": json.dumps({"url": f"{ORIGIN}/orders.html"})}}]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "b", "type": "function", "function": {
            "name": "wait", "arguments": json.dumps({"seconds": 0})}}]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "done", "arguments": json.dumps({"response": task.answer})}}]}]
    store = ImageStore(tmp_path)
    policy = OpenAIChatPolicy(scripted_chat.url, "vlm", images=store, context_images=1)
    try:
        trajectory = await run_episode(aclient, BrowserHarness(images=store), policy, task)
    finally:
        await policy.aclose()
    assert trajectory.outcome.reward == 1.0
    for request in scripted_chat.requests:
        parts = [part for message in request["messages"] if isinstance(message["content"], list)
                 for part in message["content"] if part["type"] == "image_url"]
        assert len(parts) == 1 and parts[0]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
        assert request["tools"][0]["function"]["name"] == "click"
    last = scripted_chat.requests[-1]["messages"]
    assert isinstance(last[-1]["content"], list) and isinstance(last[2]["content"], str)  # older screenshots dropped

"""MiniWoB++ from the installed package in a real sandbox's Chromium: seeded episodes, the page's own
end and raw reward, the overrides, partial credit, and the oracle over the whole catalogue."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re

import pytest

from orchard.data.trajectory import Message, ToolCall, Trajectory
from orchard.harness.browser import BrowserHarness
from orchard.harness.chromium import BrowserError, browser_of
from orchard.harness.core import Turn, run_agent
from orchard.tasks.gui.miniwob import (
    CATALOGUE,
    EPISODE_TIME_MS,
    INLINE_SCRIPT,
    MiniWoBTask,
    build_instances,
    guarded_page,
    page_names,
    sandbox_pages,
)
from orchard.tasks.gui.oracle import GUIOracle
from tests.conftest import require_root

# The catalogue pages the oracle solved in the set-of-marks mode (34 of 43, the whole catalogue run once: not click-collapsible,
# click-color, drag-box, enter-date, find-greatest, grid-coordinate, sign-agreement, use-autocomplete,
# use-slider, whose targets are unlisted shapes and points, drags, or typing into the focused field).
MARKS_PAGES = {
    "choose-list", "click-button", "click-button-sequence", "click-checkboxes", "click-checkboxes-large",
    "click-checkboxes-transfer", "click-collapsible-2", "click-dialog", "click-dialog-2", "click-link", "click-menu-2",
    "click-option", "click-tab", "click-tab-2", "click-test", "click-test-2", "click-widget", "copy-paste",
    "enter-password", "enter-text", "enter-text-2", "enter-time", "find-word", "focus-text", "focus-text-2",
    "login-user", "navigate-tree", "odd-or-even", "read-table", "scroll-text", "simple-algebra", "simple-arithmetic",
    "text-transform", "unicode-test"}

DOM = "() => document.getElementById('wrap').innerHTML"


@pytest.fixture(scope="module")
def box(client):
    """One sandbox whose browser serves every episode of this module (a fresh context each)."""
    require_root()
    with client.create(memory="2Gi", pids=1024, network="none") as sb:
        yield sb


def evaluate(sb, script: str):
    return sb.run_async(lambda b: browser_of(b).call("evaluate", script=script))


def test_the_catalogue_has_thirty_pages_of_the_package_with_action_counts():
    assert len(page_names()) == 130
    assert len(CATALOGUE) >= 30 and set(CATALOGUE) <= set(page_names())
    assert all(1 <= spec.actions[0] <= spec.actions[1] for spec in CATALOGUE.values())


def test_the_same_seed_gives_the_same_instruction_and_dom(box):
    first = box.run_async(build_instances, ["click-checkboxes", "click-button"], [7, 8])
    dom = evaluate(box, DOM)
    again = box.run_async(build_instances, ["click-button"], [8])
    assert again[0] == first[3] and evaluate(box, DOM) == dom
    assert first[0].instruction != first[1].instruction or first[2].instruction != first[3].instruction
    box.run_async(first[1].setup)  # set-up checks the instruction it finds against the instance's
    forged = MiniWoBTask("click-button", 8, "Click on the \"nothing\" button.")
    with pytest.raises(BrowserError, match="not deterministic"):
        box.run_async(forged.setup)


def test_the_page_is_prepared_time_limit_lifted_and_score_hidden(box):
    task = box.run_async(build_instances, ["click-test"], [0])[0]
    box.run_async(task.setup)
    assert evaluate(box, "() => core.EPISODE_MAX_TIME") == EPISODE_TIME_MS
    assert evaluate(box, "() => getComputedStyle(document.getElementById('reward-display')).display") == "none"
    assert evaluate(box, "() => WOB_DONE_GLOBAL") is False


def test_partial_credit_is_not_success(box):
    """find-greatest gives +0.1 for a wrong card: the page's raw reward is positive, the judge says failure."""
    task = box.run_async(build_instances, ["find-greatest"], [3])[0]
    box.run_async(task.setup)

    # The cards hide their numbers; a click shows one, Submit scores the one shown: a card that is not
    # the greatest, then Submit.
    aim = """(step) => {
      const el = step === 0 ? (() => { const cards = Array.from(document.querySelectorAll('#cardholder .card'));
        const values = cards.map(c => parseInt(c.querySelector('.card-value').textContent, 10));
        return cards[values.indexOf(Math.min(...values))]; })() : document.getElementById('submit');
      const r = el.getBoundingClientRect(); return {x: r.left + r.width / 2, y: r.top + r.height / 2}; }"""

    class WrongCard:
        name = "wrong-card"

        async def act(self, conversation, *, max_context=None):
            turns = sum(m.role == "assistant" for m in conversation.messages)
            centre = await browser_of(conversation.sandbox).call("evaluate", script=aim, argument=turns)
            return Turn(Message(role="assistant", tool_calls=[ToolCall(id=f"c{turns}", name="click", arguments=centre)]))

    trajectory = box.run_async(lambda sb: run_agent(BrowserHarness(), WrongCard(), sb, task.prompt))
    outcome = box.run_async(task.grade, trajectory)
    raw = trajectory.metadata["raw_reward"]
    if raw is None:
        pytest.fail(f"the click did not end the episode: {trajectory.metadata}")
    assert 0 < raw < 1 and outcome.reward == 0.0 and not outcome.resolved
    assert trajectory.metadata["verdict"] == "failure"


def test_an_end_of_episode_the_pages_wrapper_did_not_send_is_tampering(box):
    """Script in the page calling the event binding itself (what a page that renders the policy's text as HTML
    would let it run) cannot report a success: its report lacks the nonce only the wrapper's closure holds."""
    task = box.run_async(build_instances, ["click-test"], [0])[0]
    box.run_async(task.setup)
    evaluate(box, "() => window.orchardEvent({type: 'episode_end', ends_episode: true, raw_reward: 1, reward: 1})")
    forged = Trajectory(task_id=task.id, messages=[Message(role="user", content=task.prompt)])
    outcome = box.run_async(task.grade, forged)
    assert outcome.reward == -1.0 and not outcome.resolved and forged.tampered
    assert forged.metadata["judge_reason"] == "tampering"


def test_markup_the_page_renders_runs_no_script_so_it_ends_no_episode(box):
    """What a page that renders the policy's text as HTML would put in the DOM: an inline handler that ends
    the episode with a reward of its own (through the page's wrapper, so the report would carry the nonce),
    a ``javascript:`` link clicked, a handler that calls the binding, and a frame of markup. None of it runs: the episode does
    not end, and grading finds no end of episode."""
    task = box.run_async(build_instances, ["click-test"], [2])[0]
    box.run_async(task.setup)
    evaluate(box, """() => {
      const area = document.getElementById('query');
      area.innerHTML += '<img src="missing.png" onerror="core.endEpisode(1.0)">'
        + '<a id="forge" href="javascript:core.endEpisode(1.0)">x</a>'
        + '<svg><image href="missing.png" onerror="window.orchardEvent({type: \\'episode_end\\', raw_reward: 1})"/></svg>'
        + '<iframe srcdoc="<img src=missing.png onerror=parent.core.endEpisode(1.0)>"></iframe>';
      document.getElementById('forge').click();
    }""")
    box.run_async(lambda b: browser_of(b).call("wait", seconds=0.5))
    assert evaluate(box, "() => WOB_DONE_GLOBAL") is False
    untouched = Trajectory(task_id=task.id, messages=[Message(role="user", content=task.prompt)])
    outcome = box.run_async(task.grade, untouched)
    assert not outcome.resolved and not untouched.tampered and untouched.metadata["raw_reward"] is None


def test_the_guarded_page_allows_exactly_its_own_inline_scripts():
    html = guarded_page("click-test", "/somewhere")
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html).group(1)
    inline = INLINE_SCRIPT.findall(html)
    assert len(inline) == 1 and policy.count("'sha256-") == 1
    digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
    assert f"'sha256-{digest}'" in policy and "unsafe-inline" not in policy
    assert "object-src 'none'" in policy and "frame-src 'none'" in policy
    assert html.index("Content-Security-Policy") < html.index('<base href="file:///somewhere/miniwob/">') \
        < html.index("<script")


def test_the_browser_tools_run_no_script_and_another_page_ends_nothing(box):
    """Through the tools: javascript: URLs are refused in both tools that open one, and a page opened in the
    task's place (a catalogue page solved there) reports no end of the task's episode."""
    task = box.run_async(build_instances, ["click-button"], [4])[0]
    box.run_async(task.setup)
    root = box.run_async(sandbox_pages)
    script = "javascript:window.orchardEvent({type:'episode_end',raw_reward:1})"
    calls = [("goto_url", {"url": script}), ("new_tab", {"url": script}),
             ("goto_url", {"url": f"file://{root}/miniwob/click-test.html"})]

    class Attacker:
        name = "attacker"

        async def act(self, conversation, *, max_context=None):
            turns = sum(m.role == "assistant" for m in conversation.messages)
            if turns < len(calls):
                name, arguments = calls[turns]
                return Turn(Message(role="assistant", tool_calls=[ToolCall(id=f"c{turns}", name=name, arguments=arguments)]))
            return Turn(Message(role="assistant", tool_calls=[ToolCall(id="end", name="done", arguments={})]))

    trajectory = box.run_async(lambda sb: run_agent(BrowserHarness(), Attacker(), sb, task.prompt))
    refusals = [m.content for m in trajectory.messages if m.role == "tool"][:2]
    assert all("only http, https and file URLs" in str(r) for r in refusals), refusals
    outcome = box.run_async(task.grade, trajectory)
    # refused calls count as format errors: the paper's reward for them is -1
    assert outcome.reward == -1.0 and not outcome.resolved and not trajectory.tampered, trajectory.metadata
    assert trajectory.metadata["verdict"] == "failure" and trajectory.metadata["raw_reward"] is None


def planned_actions(trajectory: Trajectory) -> int:
    """The episode's actions, a run of waits counted once: where the oracle waits for the page (suggestions
    that come after a delay, a section that opens), it waits again while a busy machine's page catches up
    (use-autocomplete took 6 actions, not its 4, in one loaded suite run)."""
    names = [call.name for m in trajectory.messages if m.role == "assistant" for call in m.tool_calls]
    return sum(not (name == "wait" and index and names[index - 1] == "wait") for index, name in enumerate(names))


def test_a_run_of_waits_counts_as_one_action():
    def episode(*names: str) -> Trajectory:
        return Trajectory(task_id="t", messages=[Message(role="assistant", tool_calls=[ToolCall(name=n, arguments={})])
                                                 for n in names])

    assert planned_actions(episode("write", "wait", "wait", "wait", "press_keys", "done")) == 4
    assert planned_actions(episode("wait", "click", "wait", "done")) == 4


@pytest.mark.slow
async def test_the_oracle_solves_every_catalogue_task_in_its_stated_actions(aclient):
    """Over three sandboxes at once (the catalogue one page after another took about 110 s). Each episode is
    the one its instance's build leaves open: ``setup`` would open the same page with the same seed again
    (``test_the_same_seed_gives_the_same_instruction_and_dom``), and a fresh browser context and page load
    cost Chromium about a core-second each."""
    harness, failures = BrowserHarness(), []

    async def lane(pages: list[str]) -> None:
        async with aclient.create(memory="2Gi", pids=1024, network="none") as sb:
            for page in pages:
                [task] = await build_instances(sb, [page], [101])
                trajectory = await run_agent(harness, GUIOracle(task), sb, task.prompt, limits=task.family.limits,
                                             task_id=task.id)
                outcome = await task.grade(sb, trajectory)
                low, high = CATALOGUE[task.page].actions
                if outcome.reward != 1.0 or not low <= planned_actions(trajectory) <= high:
                    failures.append((task.id, outcome.reward, trajectory.metadata["steps"],
                                     planned_actions(trajectory), trajectory.metadata.get("error")))

    pages = sorted(CATALOGUE)
    await asyncio.gather(*(lane(pages[start::3]) for start in range(3)))
    assert failures == []


@pytest.mark.slow
async def test_the_oracle_in_the_set_of_marks_mode_solves_the_pages_it_has_tools_for(aclient):
    """The marks mode's tools click and type on listed elements and press keys: pages solved by those
    (buttons, links, tabs, checkboxes, dialogs, fields, keys) are solved through the marks, and a page that
    needs a drag ends with ``done`` and no other call. A sample of :data:`MARKS_PAGES` (the whole catalogue
    in this mode took about 30 s more of CI)."""
    harness, solved = BrowserHarness(marks=True), {}
    sample = ["click-checkboxes", "click-dialog", "login-user", "choose-list", "copy-paste", "drag-box"]

    async def lane(pages: list[str]) -> None:
        async with aclient.create(memory="2Gi", pids=1024, network="none") as sb:
            for page in pages:
                [task] = await build_instances(sb, [page], [101])
                trajectory = await run_agent(harness, GUIOracle(task, marks=True), sb, task.prompt,
                                             limits=task.family.limits, task_id=task.id)
                calls = {call.name for m in trajectory.messages if m.role == "assistant" for call in m.tool_calls}
                assert calls <= {"click_mark", "type_mark", "press_keys", "done"}, (page, calls)
                solved[page] = (await task.grade(sb, trajectory)).reward == 1.0

    await asyncio.gather(*(lane(sample[start::3]) for start in range(3)))
    assert {page for page, ok in solved.items() if ok} == set(sample) & MARKS_PAGES == set(sample) - {"drag-box"}

"""An oracle teacher: a policy that knows the gold patch and reaches it through a real harness.

The embedded default has no LLM teacher, so trajectories for credit-assignment SFT come from this
policy, run by the real bash or CodeAct harness in a real sandbox: every observation is what the
sandbox answered. It works the way a competent engineer does: run the failing tests, search for the
code they exercise, read it, edit it, re-run the tests, submit. It is not a model and learns
nothing; it exists so the rest of the pipeline (collection, values, SFT, RL) runs on real
environment interaction without an API key. Variants make the data realistic:

- ``clean``: the straight path above;
- ``wander``: the same, with one to three detours (listing, reading an unrelated file, a search
  that finds nothing useful) before it reads the right code;
- ``recover``: it localises the bug, edits a wrong line next to it, reruns the failing tests and
  sees them still fail, reverts that edit (``git checkout``), makes the right one, reruns, submits:
  the check-and-retry behaviour verification exists for;
- ``search``: it localises the bug as ``clean`` does, then does not use what it knows of the fix: it
  writes a script that tries every one-token change to the lines of the function it read, rerunning the
  tests after each and keeping the first that passes (:mod:`orchard.tasks.swe.candidates`; where the task's
  text offers the sandbox's ``repair`` command, it runs that instead), reruns the
  failing tests and submits. Every action follows from what the agent saw, so a policy that imitates it
  learns a procedure that carries to code it never saw; ``clean``'s edit states a fix that only arithmetic
  on the failing assertion would find. When no change passes (the bug's inverse is not a one-token
  change), the run ends unresolved, after real localisation.

And two imperfect teachers, whose failures hold real partial progress, labelled by their names
(``oracle-fail``, ``oracle-unverified``):

- ``fail``: it localises the bug correctly, then edits a wrong line next to it, sees the tests
  still fail, and submits anyway;
- ``unverified``: it localises the bug, makes the same wrong edit and submits without running the
  tests again.

These stand in for the paper's LLM teachers' failed runs, which often find the right code and then
write a wrong fix: their rise segments cover the localisation and not the edit, which is what
credit-assignment SFT keeps of them (and what the LLM-judge value estimator, reading the same
transcript, scores as progress). Unlike an LLM's, the oracle's mistakes are scripted, always next to
the bug and always one edit.

The failing test run is read, not only shown: the search looks for the function the traceback names
(``where X = name(...)``, or the deepest frame in a code file), as an engineer reading it would.

``brief=True`` drops the test runs (reproduce, re-check): search, read, edit, submit. It gives
the short trajectories a tiny model can learn from in minutes (``configs/swe_bar.py:tiny``); the
``recover`` variant needs the re-check and is refused with it.

The edits are in each harness's own idiom: a patch applied with ``git apply`` from a heredoc in the
bash harness, ``str_replace_editor`` calls (one per hunk) in the CodeAct harness.
"""

from __future__ import annotations

import os
import random
import re
import shlex
from dataclasses import dataclass
from typing import Literal

from orchard.data.rise import BugLocationEstimator
from orchard.data.trajectory import Message, ToolCall
from orchard.harness.bash import SUBMIT_COMMAND
from orchard.harness.core import Conversation, Turn
from orchard.seeds import seeded_random
from orchard.tasks.swe.candidates import REPAIR_TOOL_HELP, listing_line, numbered_lines, repair_command
from orchard.tasks.swe.diffs import Hunk, parse_patch
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.workspace import REPO_DIR

Style = Literal["bash", "codeact"]
Variant = Literal["clean", "wander", "recover", "search", "fail", "unverified"]
VARIANTS: tuple[str, ...] = ("clean", "wander", "recover", "search", "fail", "unverified")
RESOLVING = ("clean", "wander", "recover")  # the variants that fix the bug


def buggy_line(hunk: Hunk) -> tuple[int, str]:
    """The first removed line of a hunk: its number in the buggy file and its text."""
    number = hunk.old_start
    for old in hunk.old:
        if old not in hunk.new or hunk.old.count(old) != hunk.new.count(old):
            return number, old
        number += 1
    return hunk.old_start, hunk.old[0] if hunk.old else ""


def estimator_for(instance: SWEInstance) -> BugLocationEstimator:
    """Rule-based values for an instance whose gold patch shows where the bug is."""
    hunk = parse_patch(instance.patch)[0]
    number, text = buggy_line(hunk)
    return BugLocationEstimator(hunk.path, text, number)


def _symbol(instance: SWEInstance, hunk: Hunk) -> str:
    """What a developer would search for: the function a failing test is named after
    (``test_intersection`` -> ``def intersection``), else the function in the hunk header, else the
    file name."""
    for test in instance.FAIL_TO_PASS:
        name = re.sub(r"\[.*\]$", "", test.rsplit("::", 1)[-1]).removeprefix("test_")
        if name:
            return f"def {name.split('_')[0] if len(name) > 30 else name}"
    if match := re.search(r"(?:def|class)\s+(\w+)", hunk.section):
        return f"def {match.group(1)}"
    return hunk.path.rsplit("/", 1)[-1]


def _sed_script(hunk: Hunk, number: int) -> str | None:
    """A ``sed`` script for a one-line fix, as engineers write them: addressed by the enclosing
    ``def`` when the bug is the first line after it (``K{/def f(/{n;s/.*/NEW/}}``, the ``def`` on line
    K: a file may have several functions of that name, such as two classes' ``__init__``), else by
    line number; ``None`` for larger fixes (which go through ``git apply``)."""
    removed = [line for line in hunk.old if line not in hunk.new]
    added = [line for line in hunk.new if line not in hunk.old]
    if len(removed) != 1 or len(added) != 1:
        return None
    replacement = re.sub(r"([\\/&])", r"\\\1", added[0])
    index = number - hunk.old_start
    previous = hunk.old[index - 1] if 0 < index <= len(hunk.old) else ""
    if match := re.match(r"\s*(?:async\s+)?def\s+(\w+)\(", previous):
        return f"{number - 1}{{/def {match.group(1)}(/{{n;s/.*/{replacement}/}}}}"
    return f"{number}s/.*/{replacement}/"


def _enclosing_function(hunk: Hunk, number: int) -> str | None:
    """The function the buggy line is in: the nearest ``def`` above it in the hunk, else the one git
    names in the hunk header."""
    for line in reversed(hunk.old[: number - hunk.old_start]):
        if match := re.match(r"\s*(?:async\s+)?def\s+(\w+)\(", line):
            return match.group(1)
    match = re.search(r"def\s+(\w+)", hunk.section)
    return match.group(1) if match else None


def _fixed_line(hunk: Hunk) -> str | None:
    """The first line the fix adds, if it adds one."""
    return next((line for line in hunk.new if line not in hunk.old), None)


def _offers_repair_tool(conversation: Conversation) -> bool:
    """Whether the task's text says its sandbox has the ``repair`` command (``tasks.repair_tool``)."""
    return any(message.role == "user" and REPAIR_TOOL_HELP in (message.content or "")
               for message in conversation.messages)


def _last_observation(conversation: Conversation) -> str:
    """What the environment answered the agent's last action (a tool message, or the user turn a text harness
    sends); empty before the first action (the task's own text is not an observation)."""
    if not any(message.role == "assistant" for message in conversation.messages):
        return ""
    for message in reversed(conversation.messages):
        if message.role in ("tool", "user"):
            return message.content or ""
    return ""


def _traceback_function(output: str) -> str | None:
    """The function a pytest failure names: the deepest frame outside the tests (``path:N: in name``),
    else the call whose value an assertion compared (``where X = name(...)``)."""
    frames = [name for path, name in re.findall(r"^([\w./-]+\.py):\d+: in (\w+)", output, re.MULTILINE)
              if not re.search(r"(^|/)(tests?/|test_)", path)]
    if frames:
        return frames[-1]
    called = re.findall(r"where .* = (?:[\w.]*\.)?(\w+)\(", output)
    return called[0] if called else None


@dataclass(frozen=True)
class Step:
    thought: str
    tool: str  # "bash", "edit" (str_replace_editor) or "finish"
    arguments: dict


class OracleTeacher:
    """A :class:`~orchard.harness.core.Policy` that plays the plan for one instance."""

    def __init__(self, instance: SWEInstance, style: Style, variant: Variant = "clean", seed: int = 0, *,
                 brief: bool = False) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown oracle variant {variant!r}; variants: {', '.join(VARIANTS)}")
        if brief and variant in ("recover", "search"):
            raise ValueError(f"the {variant} variant reruns the tests, which the brief plan leaves out")
        self.instance, self.style, self.variant, self.brief = instance, style, variant, brief
        self.name = f"oracle-{variant}{'-brief' if brief else ''}"
        self.plan = self._plan(seeded_random(seed, "swe-oracle", instance.instance_id, style, variant))

    def _plan(self, rng: random.Random) -> list[Step]:
        hunks = parse_patch(self.instance.patch)
        tests = " ".join(shlex.quote(t) for t in self.instance.FAIL_TO_PASS[:3])
        first = hunks[0]
        start = max(1, first.old_start - 8)
        end = first.old_start + len(first.old) + 8
        # short tracebacks, no summary: the frames and the failed assertion, in half the text of pytest's default
        run = f"python -m pytest -q --tb=short -rN {tests}"
        rerun = Step("Let me run the failing tests again.", "bash", {"command": run})
        steps = [Step("Let me reproduce the failure first.", "bash", {"command": run}),
                 Step("", "search", {"symbol": _symbol(self.instance, first)})]
        if self.variant == "wander":
            detours = [Step("Let me get an overview of the repository.", "bash", {"command": "ls -R | head -50"}),
                       Step("Maybe the README explains the expected behaviour.", "bash",
                            {"command": "cat README* 2>/dev/null | head -40 || true"}),
                       Step("Let me check the recent history.", "bash", {"command": "git log --oneline | head"})]
            steps[1:1] = rng.sample(detours, rng.randint(1, len(detours)))
        if self.brief:
            steps.pop(0)
        steps.append(Step("", "view", {"path": first.path, "start": start, "end": end, "bug": buggy_line(first)[0]}))
        if self.variant in ("fail", "unverified", "recover"):
            steps.append(self._wrong_edit(first))
        if self.variant == "recover":
            steps += [rerun, Step(f"The tests still fail, so that line was fine. Let me undo the change to "
                                  f"{first.path}.", "bash", {"command": f"git checkout -- {shlex.quote(first.path)}"})]
        if self.variant in RESOLVING:
            steps += [self._edit(hunk) for hunk in hunks]
        if self.variant == "search":
            steps.append(Step("", "try", {"hunk": first}))
        if not self.brief and self.variant != "unverified":
            steps.append(rerun)
        if self.variant == "search":
            return [*steps, Step("", "close", {})]
        closing = {"fail": "I could not make the tests pass; submitting what I have.",
                   "unverified": "That should be it; submitting."}
        steps.append(Step(closing.get(self.variant, "The failing tests pass now; submitting." if not self.brief
                                      else "The change is done; submitting."), "finish", {}))
        return steps

    def _search(self, symbol: str, conversation: Conversation) -> Step:
        """Search for what the last test run's traceback names, else ``symbol`` (the plan's guess)."""
        reported = _traceback_function(_last_observation(conversation))
        if reported:
            symbol = f"def {reported}"
            thought = f"The traceback points at `{reported}`; let me find it."
        else:
            thought = f"Let me find the code the failing tests exercise (`{symbol}`)."
        return Step(thought, "bash", {"command": f"grep -rn {shlex.quote(symbol)} --include=*.py . | head -20"})

    def _view(self, path: str, start: int, end: int, bug: int, conversation: Conversation) -> Step:
        """Read the buggy code: from the definition the search found, as an engineer reads on from a
        grep hit (and far enough to cover the bug), or around the bug when the search missed it."""
        hits = [int(m) for message in conversation.messages if message.role != "assistant"
                for m in re.findall(rf"^(?:\./)?{re.escape(path)}:(\d+):", message.content or "", re.MULTILINE)]
        if hits and hits[-1] <= bug:
            start, end = hits[-1], max(hits[-1] + 15, end)
        thought = f"Let me read {path} from line {start}."
        if self.style == "bash":
            # GNU sed's `start,+N` range: the agent copies the line it found and needs no arithmetic.
            return Step(thought, "bash", {"command": f"nl -ba {shlex.quote(path)} | sed -n '{start},+{end - start}p'"})
        # The editor refuses a range past the file's end (as OpenHands' does): stop there, or read to the end when
        # the snapshot is not a directory to count its lines in.
        lines = self._line_count(path)
        return Step(thought, "edit", {"command": "view", "path": f"{REPO_DIR}/{path}",
                                      "view_range": [start, min(end, lines) if lines else -1]})

    def _line_count(self, path: str) -> int | None:
        """How many lines ``path`` has in the task's snapshot, when the snapshot is a directory."""
        if not self.instance.repo_path or not os.path.isdir(self.instance.repo_path):
            return None
        try:
            with open(os.path.join(self.instance.repo_path, path), errors="replace") as handle:
                return len(handle.read().split("\n"))
        except OSError:
            return None

    def _edit(self, hunk: Hunk) -> Step:
        number, text = buggy_line(hunk)
        # The function, the line to change quoted as `nl -ba` showed it (the number right-aligned in six places, a
        # tab, the text), then the line the edit writes. Quoted so, the line's text follows its number as in what
        # the agent read, so only the number is a choice: a policy that copies (a copy head's exact matches) writes
        # the rest from there, and the fix is that text with a change, stated just before the edit writes it.
        function = _enclosing_function(hunk, number)
        where = f"The bug is in `def {function}`, on this line of {hunk.path}:" if function else \
            f"The bug is on this line of {hunk.path}:"
        fixed = _fixed_line(hunk)
        thought = f"{where}\n{listing_line(number, text)}\n" + \
            (f"It should be `{fixed}`. " if fixed is not None else "") + "Fixing it."
        if self.style == "codeact":
            return Step(thought, "edit", {"command": "str_replace", "path": f"{REPO_DIR}/{hunk.path}",
                                          "old_str": "\n".join(hunk.old), "new_str": "\n".join(hunk.new)})
        if (script := _sed_script(hunk, number)) is not None:
            return Step(thought, "bash", {"command": f"sed -i {shlex.quote(script)} {shlex.quote(hunk.path)}"})
        patch = hunk.patch()
        return Step(thought, "bash", {"command": f"cat > /tmp/fix.patch <<'PATCH'\n{patch}PATCH\ngit apply /tmp/fix.patch"})

    def _try(self, hunk: Hunk, conversation: Conversation) -> Step:
        """Run the repair script on the function the buggy line is in, as the agent read it (the last
        observation), or, when that listing does not show the function's ``def``, make the known fix. The
        script is written out, or, where the task's text offers it, run as the sandbox's ``repair`` command."""
        number = buggy_line(hunk)[0]
        listing = numbered_lines(_last_observation(conversation))
        # the function the buggy line is in, as the listing shows it (the hunk's three lines of context may not
        # reach its def)
        defs = [(n, match.group(1)) for n in sorted(listing) if n <= number
                if (match := re.match(r"\s*def\s+(\w+)\(", listing[n]))]
        if not defs:
            return self._edit(hunk)
        line, function = defs[-1]
        thought = (f"Nothing in `def {function}` looks wrong to me at a glance, so let me try each one-token change "
                   f"to its lines, rerunning the tests after each, and keep the first that makes them pass.")
        return Step(thought, "bash", {"command": repair_command(hunk.path, line, tool=_offers_repair_tool(conversation))})

    @staticmethod
    def _close(conversation: Conversation) -> Step:
        """Submit, saying whether the last test run passed."""
        output = _last_observation(conversation)
        passed = re.search(r"\d+ passed", output) and not re.search(r"\d+ (failed|error)", output)
        return Step("The failing tests pass now; submitting." if passed else
                    "I could not make the tests pass; submitting what I have.", "finish", {})

    def _wrong_edit(self, hunk: Hunk) -> Step:
        """Edit a line next to the bug (a plausible but wrong fix): a comment saying it was checked."""
        number, _ = buggy_line(hunk)
        index = next((i for i, line in enumerate(hunk.old) if line.strip() and hunk.old_start + i != number),
                     0)
        line = hunk.old[index]
        thought = f"I think the problem is on line {hunk.old_start + index} of {hunk.path}. Changing it."
        replacement = f"{line}  # checked"
        if self.style == "codeact":
            return Step(thought, "edit", {"command": "str_replace", "path": f"{REPO_DIR}/{hunk.path}", "old_str": line,
                                          "new_str": replacement})
        sed = f"{hunk.old_start + index}s/$/  # checked/"
        return Step(thought, "bash", {"command": f"sed -i {shlex.quote(sed)} {shlex.quote(hunk.path)}"})

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        index = sum(m.role == "assistant" for m in conversation.messages)
        step = self.plan[min(index, len(self.plan) - 1)]
        if step.tool == "view":
            step = self._view(**step.arguments, conversation=conversation)
        elif step.tool == "search":
            step = self._search(step.arguments["symbol"], conversation)
        elif step.tool == "try":
            step = self._try(step.arguments["hunk"], conversation)
        elif step.tool == "close":
            step = self._close(conversation)
        if self.style == "bash":
            command = SUBMIT_COMMAND if step.tool == "finish" else step.arguments["command"]
            return Turn(Message(role="assistant", content=f"THOUGHT: {step.thought}\n\n```bash\n{command}\n```"))
        name = {"bash": "execute_bash", "edit": "str_replace_editor", "finish": "finish"}[step.tool]
        arguments = {"message": step.thought} if step.tool == "finish" else step.arguments
        call = ToolCall(id=f"call_{index}", name=name, arguments=arguments)
        return Turn(Message(role="assistant", content=step.thought, tool_calls=[call]))

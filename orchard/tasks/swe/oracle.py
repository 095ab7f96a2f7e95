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
- ``recover``: it localises the bug, makes a plausible but wrong fix, reruns the failing tests and
  sees them still fail, reverts that edit (``git checkout``), makes the right one, reruns, submits:
  the check-and-retry behaviour verification exists for.

And two imperfect teachers, whose failures hold real partial progress, labelled by their names
(``oracle-fail``, ``oracle-unverified``):

- ``fail``: it localises the bug correctly, then makes a plausible but wrong fix, sees the tests
  still fail, and submits anyway;
- ``unverified``: it localises the bug, makes the same wrong edit and submits without running the
  tests again.

These stand in for the paper's LLM teachers' failed runs, which often find the right code and then
write a wrong fix: their rise segments cover the localisation and not the edit, which is what
credit-assignment SFT keeps of them (and what the LLM-judge value estimator, reading the same
transcript, scores as progress). Unlike an LLM's, the oracle's mistakes are scripted and always one
edit: one operator swapped or one integer moved by one (:func:`plausible_mutation`) on another line of the
buggy function, else on the buggy line itself, said and written exactly as a right fix is. A policy that
imitates it learns to try a fix, check it and undo it, not a ritual edit: when the wrong edit was a
comment, the tiny policy learned to append the comment.

The failing test run is read, not only shown: the search looks for the function the traceback names
(``where X = name(...)``, or the deepest frame in a code file), as an engineer reading it would.

``brief=True`` drops the test runs (reproduce, re-check): search, read, edit, submit. It gives
the short trajectories a tiny model can learn from in minutes (``configs/swe_bar.py:tiny``); the
``recover`` variant needs the re-check and is refused with it.

The edits are in each harness's own idiom: a patch applied with ``git apply`` from a heredoc in the
bash harness, ``str_replace_editor`` calls (one per hunk) in the CodeAct harness.
"""

from __future__ import annotations

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
from orchard.tasks.swe.diffs import Hunk, parse_patch
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.workspace import REPO_DIR

Style = Literal["bash", "codeact"]
Variant = Literal["clean", "wander", "recover", "fail", "unverified"]
VARIANTS: tuple[str, ...] = ("clean", "wander", "recover", "fail", "unverified")
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
    replacement = _sed_escape(added[0])
    index = number - hunk.old_start
    previous = hunk.old[index - 1] if 0 < index <= len(hunk.old) else ""
    if match := re.match(r"\s*(?:async\s+)?def\s+(\w+)\(", previous):
        return f"{number - 1}{{/def {match.group(1)}(/{{n;s/.*/{replacement}/}}}}"
    return f"{number}s/.*/{replacement}/"


# A wrong fix's operator swaps (the code's own spacing: binary operators between spaces) and integer literals.
_OPERATOR_SWAPS = {" + ": " - ", " - ": " + ", " * ": " // ", " // ": " * ", " < ": " <= ", " <= ": " < ",
                   " > ": " >= ", " >= ": " > ", " == ": " != ", " != ": " == "}
_INTEGER = re.compile(r"(?<![\w.])\d+(?![\w.])")


def plausible_mutation(line: str, rng: random.Random, avoid: str | None = None) -> str | None:
    """``line`` with one operator swapped or one integer literal moved by one, as a wrong fix makes it; None for a
    line that is not code (blank, a ``def``, a docstring, a comment) or has nothing to change (or only ``avoid``)."""
    code = line.strip()
    if not code or code.startswith(("def ", "class ", "@", "#", '"', "'")):
        return None
    options = [line[:m.start()] + new + line[m.end():] for old, new in _OPERATOR_SWAPS.items()
               for m in re.finditer(re.escape(old), line)]
    options += [line[:m.start()] + str(max(int(m.group()) + delta, 0)) + line[m.end():]
                for m in _INTEGER.finditer(line) for delta in (1, -1)]
    options = sorted({option for option in options if option not in (line, avoid)})
    return rng.choice(options) if options else None


def _function_lines(hunk: Hunk, number: int) -> list[tuple[int, str]]:
    """The hunk's old lines (index, text) in the function around line ``number``: from the nearest ``def`` above
    it (or the hunk's start) to the next ``def`` (or the hunk's end)."""
    index = number - hunk.old_start
    start = next((i for i in range(index, -1, -1) if re.match(r"\s*(?:async\s+)?def\s", hunk.old[i])), 0)
    end = next((i for i in range(index + 1, len(hunk.old)) if re.match(r"\s*(?:async\s+)?def\s", hunk.old[i])),
               len(hunk.old))
    return list(enumerate(hunk.old))[start:end]


def _sed_escape(text: str) -> str:
    """``text`` as a ``sed`` replacement: backslashes, slashes and ampersands escaped."""
    return re.sub(r"([\\/&])", r"\\\1", text)


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
        if brief and variant == "recover":
            raise ValueError("the recover variant reruns the tests, which the brief plan leaves out")
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
            steps.append(self._wrong_edit(first, rng))
        if self.variant == "recover":
            steps += [rerun, Step(f"The tests still fail, so that line was fine. Let me undo the change to "
                                  f"{first.path}.", "bash", {"command": f"git checkout -- {shlex.quote(first.path)}"})]
        if self.variant in RESOLVING:
            steps += [self._edit(hunk) for hunk in hunks]
        if not self.brief and self.variant != "unverified":
            steps.append(rerun)
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
        return Step(thought, "edit", {"command": "view", "path": f"{REPO_DIR}/{path}", "view_range": [start, end]})

    def _edit(self, hunk: Hunk) -> Step:
        number, text = buggy_line(hunk)
        fixed = _fixed_line(hunk)
        if self.style == "codeact":
            return Step(self._edit_thought(hunk, number, text, fixed), "edit",
                        {"command": "str_replace", "path": f"{REPO_DIR}/{hunk.path}", "old_str": "\n".join(hunk.old),
                         "new_str": "\n".join(hunk.new)})
        if (script := _sed_script(hunk, number)) is not None:
            return Step(self._edit_thought(hunk, number, text, fixed), "bash",
                        {"command": f"sed -i {shlex.quote(script)} {shlex.quote(hunk.path)}"})
        patch = hunk.patch()
        return Step(self._edit_thought(hunk, number, text, fixed), "bash",
                    {"command": f"cat > /tmp/fix.patch <<'PATCH'\n{patch}PATCH\ngit apply /tmp/fix.patch"})

    @staticmethod
    def _edit_thought(hunk: Hunk, number: int, text: str, fixed: str | None) -> str:
        """What the teacher says before an edit, right or wrong: the function, then the line it writes, and only
        then the one it replaces, so what the edit writes is stated just before it."""
        function = _enclosing_function(hunk, number)
        where = f"Line {number} of {hunk.path}" + (f", in `def {function}`," if function else "")
        return (f"{where} should be `{fixed.strip()}`, not `{text.strip()}`. Fixing it." if fixed is not None
                else f"{where} is wrong: `{text.strip()}`. Fixing it.")

    def _wrong_edit(self, hunk: Hunk, rng: random.Random) -> Step:
        """A plausible but wrong fix, said and written as the right one is: one operator swapped or one integer
        moved by one (:func:`plausible_mutation`) on another code line of the buggy function in the hunk, else a
        different change to the buggy line itself; the bug stays, so the tests still fail."""
        number, text = buggy_line(hunk)
        fixed = _fixed_line(hunk)
        candidates = [(hunk.old_start + i, line) for i, line in _function_lines(hunk, number)
                      if hunk.old_start + i != number]
        candidates = [(n, line, wrong) for n, line in candidates if (wrong := plausible_mutation(line, rng))]
        if not candidates and (wrong := plausible_mutation(text, rng, avoid=fixed)):
            candidates = [(number, text, wrong)]
        if not candidates:  # nothing to change plausibly: a comment that changes nothing
            candidates = [(number, text, f"{text}  # checked")]
        line_number, line, wrong = rng.choice(candidates)
        thought = self._edit_thought(hunk, line_number, line, wrong)
        if self.style == "codeact":
            return Step(thought, "edit", {"command": "str_replace", "path": f"{REPO_DIR}/{hunk.path}", "old_str": line,
                                          "new_str": wrong})
        sed = f"{line_number}s/.*/{_sed_escape(wrong)}/"
        return Step(thought, "bash", {"command": f"sed -i {shlex.quote(sed)} {shlex.quote(hunk.path)}"})

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        index = sum(m.role == "assistant" for m in conversation.messages)
        step = self.plan[min(index, len(self.plan) - 1)]
        if step.tool == "view":
            step = self._view(**step.arguments, conversation=conversation)
        elif step.tool == "search":
            step = self._search(step.arguments["symbol"], conversation)
        if self.style == "bash":
            command = SUBMIT_COMMAND if step.tool == "finish" else step.arguments["command"]
            return Turn(Message(role="assistant", content=f"THOUGHT: {step.thought}\n\n```bash\n{command}\n```"))
        name = {"bash": "execute_bash", "edit": "str_replace_editor", "finish": "finish"}[step.tool]
        arguments = {"message": step.thought} if step.tool == "finish" else step.arguments
        call = ToolCall(id=f"call_{index}", name=name, arguments=arguments)
        return Turn(Message(role="assistant", content=step.thought, tool_calls=[call]))

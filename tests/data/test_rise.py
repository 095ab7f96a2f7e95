"""Rise segments exactly as defined, and the rule-based value estimator (the LLM judge: tests/eval/test_judge.py)."""

from __future__ import annotations

import pytest

from orchard.data.rise import BugLocationEstimator, annotate, rise_segments
from orchard.data.trajectory import Message, Outcome, Trajectory


@pytest.mark.parametrize(("values", "segments"), [
    ([0.5, 0.5, 0.4, 0.4], []),                                   # none
    ([0.1, 0.3, 0.5, 0.9], [(0, 2)]),                             # every step rises
    ([0.1, 0.3, 0.3, 0.3, 0.6, 0.8], [(0, 0), (3, 4)]),           # a plateau splits two rises
    ([0.2, 0.2, 0.2, 0.5], [(2, 2)]),                             # a rise that reaches the last action
    ([0.0, 0.25, 0.3, 0.3], [(0, 1)]),                            # exactly epsilon counts
    ([0.0, 0.25, 0.29, 0.3], [(0, 0)]),                           # just under epsilon does not
    ([0.7], []),                                                  # no actions
])
def test_rise_segments(values, segments):
    assert rise_segments(values, epsilon=0.05) == segments


def test_rise_segments_at_epsilon_with_exact_binary_values():
    assert rise_segments([0.0, 0.5, 0.75, 0.875], epsilon=0.125) == [(0, 2)]
    assert rise_segments([0.0, 0.5, 0.75, 0.875], epsilon=0.25) == [(0, 1)]


def trajectory(actions: list[str], observations: list[str], resolved: bool = False) -> Trajectory:
    messages = [Message(role="user", content="Fix the failing test in calc.py")]
    for action, observation in zip(actions, observations, strict=True):
        messages += [Message(role="assistant", content=action), Message(role="tool", content=observation)]
    return Trajectory(task_id="calc", messages=messages, outcome=Outcome(resolved=resolved))


def test_bug_location_estimator_scores_milestones():
    run = trajectory(["ls", "cat calc.py", "sed -i '2s/a - b/a + b/' calc.py", "pytest"],
                     ["calc.py test_calc.py", "def add(a, b):\n    return a - b", "", "1 failed"])
    estimator = BugLocationEstimator(buggy_file="src/calc.py", buggy_line="return a - b", line_number=2)
    elsewhere = run.model_copy(update={"messages": [
        m.model_copy(update={"content": m.content.replace("'2s/", "'12s/")}) for m in run.messages]})
    assert estimator.estimate(elsewhere) == pytest.approx([0.1, 0.3, 0.5, 0.5, 0.0])  # an edit of another line
    values = estimator.estimate(run)
    assert values == pytest.approx([0.1, 0.3, 0.5, 0.8, 0.0])  # found the file, saw the line, edited, failed
    annotated = annotate(run, estimator)
    assert annotated.rise_segments == [(0, 2)] and annotated.values == values
    assert estimator.estimate(run.model_copy(update={"outcome": Outcome(resolved=True)}))[-1] == 1.0

"""Rise segments exactly as defined, and the value estimators (a judge over real HTTP, and rules)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchard.data.rise import BugLocationEstimator, LLMJudge, annotate, parse_values, rise_segments
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


def test_parse_values_is_lenient_about_wrapping_and_strict_about_content():
    assert parse_values('Sure!\n```json\n{"values": [0, 0.5, 1]}\n```', 3) == [0.0, 0.5, 1.0]
    assert parse_values("values: [0.1, 0.2] as asked", 2) == [0.1, 0.2]
    with pytest.raises(ValueError, match="expected 3"):
        parse_values('{"values": [0.1, 0.2]}', 3)
    with pytest.raises(ValueError, match="probabilities"):
        parse_values('{"values": [0.1, 1.2]}', 2)
    with pytest.raises(ValueError, match="no JSON"):
        parse_values("I cannot do that.", 2)


class ScriptedJudge:
    """A real HTTP server on loopback speaking /v1/chat/completions, replying from a script."""

    def __init__(self, replies: list[tuple[int, str]]) -> None:
        self.replies, self.requests = list(replies), []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                judge.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                status, content = judge.replies.pop(0)
                body = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_llm_judge_retries_bad_replies_and_caches(tmp_path):
    run = trajectory(["ls", "cat calc.py"], ["calc.py", "x" * 10_000])
    judge_server = ScriptedJudge([(503, "busy"), (200, "I think it went well."), (200, '{"values": [0.1, 0.2]}'),
                                  (200, "```json\n{\"values\": [0.1, 0.4, 0.0]}\n```")])
    try:
        judge = LLMJudge(judge_server.url, model="judge", cache_dir=str(tmp_path / "cache"))
        assert judge.estimate(run) == [0.1, 0.4, 0.0]
        assert len(judge_server.requests) == 4  # 503 retried; two unusable replies retried with feedback
        prompt = judge_server.requests[0]["messages"][1]["content"]
        assert "resolved: False" in prompt and "cat calc.py" in prompt and "chars ..." in prompt  # long output cut
        assert "expected 3 values" in judge_server.requests[3]["messages"][-1]["content"]
        assert judge.estimate(run) == [0.1, 0.4, 0.0] and len(judge_server.requests) == 4  # from the cache
    finally:
        judge_server.close()


def test_llm_judge_gives_up_with_a_clear_error():
    judge_server = ScriptedJudge([(200, "no idea")] * 3)
    try:
        with pytest.raises(ValueError, match="no usable values after 3 attempts"):
            LLMJudge(judge_server.url, model="judge", retries=2).estimate(trajectory(["ls"], ["a"]))
    finally:
        judge_server.close()

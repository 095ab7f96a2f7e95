"""The LLM judge of retrospective values: lenient parsing, retries with the problem named, a disk cache,
over real HTTP."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchard.eval.judge import LLMJudge, parse_values
from tests.data.test_rise import trajectory


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

"""The recording proxy, a real ``orchard proxy`` process in front of a real ``orchard serve`` (of a random policy)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import litellm
import openai
import pytest

from orchard.data.jsonl import JsonlWriter
from orchard.env.local import free_port
from orchard.rollout.proxy_client import ProxyClient
from orchard.rollout.proxy_records import read_session
from tests.conftest import ADMIN, Proxy, cli_server, wait_until

MESSAGES = [{"role": "user", "content": "Name a colour."}]


def chat(url: str, key: str = "none", headers: dict | None = None, **fields) -> httpx.Response:
    body = {"model": "anything", "messages": MESSAGES, "max_tokens": 4, "temperature": 0, **fields}
    return httpx.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}",
                                                                      **(headers or {})}, timeout=60)


def test_calls_are_attributed_by_path_key_and_header_and_bad_sessions_fail_loudly(proxy):
    session = proxy.open()
    assert chat(session["base_url"]).status_code == 200  # by path
    assert chat(f"{proxy.root}/v1", key=session["api_key"]).status_code == 200  # by key
    assert chat(f"{proxy.root}/v1", headers={"X-Orchard-Session": session["id"]}).status_code == 200  # by header
    assert len(read_session(session["records"]).calls) == 3
    assert chat(f"{proxy.root}/s/nosuchsession/v1").status_code == 404
    assert chat(f"{proxy.root}/v1").status_code == 404  # no session at all
    proxy.close(session)
    closed = chat(session["base_url"])
    assert closed.status_code == 409 and "closed" in closed.json()["error"]["message"]
    assert httpx.post(f"{proxy.root}/sessions", json={"task": "t", "harness": "h"}).status_code == 401


def test_the_trainer_sets_sampling_and_the_reply_is_the_plain_shape_asked_for(proxy, policy_server):
    session = proxy.open(sampling={"temperature": 0, "max_tokens": 3, "seed": 7})
    reply = chat(session["base_url"], temperature=1.7, max_tokens=50, seed=1, model="the-harness-model").json()
    choice = reply["choices"][0]
    assert "token_ids" not in choice and "prompt_token_ids" not in reply and choice["logprobs"] is None  # stripped
    call = read_session(session["records"]).calls[0]
    sent = call["upstream_request"]
    assert (sent["temperature"], sent["max_tokens"], sent["seed"], sent["model"]) == (0, 3, 7, policy_server.name)
    assert call["request"]["temperature"] == 1.7  # the request as the harness sent it is kept too
    assert len(call["completions"][0]["token_ids"]) <= 3 and call["usable_for_rl"]
    asked = chat(session["base_url"], return_token_ids=True, logprobs=True).json()
    assert asked["choices"][0]["token_ids"] and asked["prompt_token_ids"] and asked["choices"][0]["logprobs"]


def test_recorded_ids_and_logprobs_are_the_server_s(proxy, policy_server):
    session = proxy.open(sampling={"temperature": 0, "max_tokens": 8})
    chat(session["base_url"])
    direct = chat(policy_server.url, model=policy_server.name, max_tokens=8, return_token_ids=True,
                  logprobs=True).json()
    call = read_session(session["records"]).calls[0]
    assert call["prompt_token_ids"][0] == direct["prompt_token_ids"]
    assert call["completions"][0]["token_ids"] == direct["choices"][0]["token_ids"]
    logprobs = [entry["logprob"] for entry in direct["choices"][0]["logprobs"]["content"]]
    assert call["completions"][0]["logprobs"] == pytest.approx(logprobs, abs=1e-5)
    assert call["weight_version"] == direct["weight_version"] and call["ttft_s"] is not None


def test_a_stream_passes_through_before_it_ends_and_is_recorded_as_the_unstreamed_call(proxy):
    # 200 tokens: the stream's first chunk (sent before any token is sampled) reaches the client long before the
    # last token and the record (with 12, a fast server could finish the call before the client read a chunk).
    session = proxy.open(sampling={"temperature": 0, "max_tokens": 200})
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    stream = client.chat.completions.create(model="x", messages=MESSAGES, stream=True)
    first = next(iter(stream))
    assert first.choices and read_session(session["records"]).calls == []  # forwarded before the stream ended
    text = (first.choices[0].delta.content or "") + "".join(c.choices[0].delta.content or "" for c in stream
                                                            if c.choices)
    chat(session["base_url"])  # the same call, not streamed
    streamed, plain = read_session(session["records"]).calls
    assert streamed["status"] == "ok" and streamed["usable_for_rl"]
    assert len(streamed["completions"][0]["token_ids"]) == 200  # no early stop: the margin above held
    assert streamed["completions"][0]["token_ids"] == plain["completions"][0]["token_ids"]
    assert streamed["prompt_token_ids"] == plain["prompt_token_ids"]
    assert streamed["completions"][0]["text"] == text == plain["completions"][0]["text"]


def test_a_client_that_disconnects_leaves_a_record_marked_so(proxy):
    session = proxy.open(sampling={"temperature": 0, "max_tokens": 200})
    body = {"model": "x", "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{session['base_url']}/chat/completions", json=body, timeout=60) as response:
        next(response.iter_lines())
    wait_until(lambda: bool(read_session(session["records"]).calls), timeout=60, what="the disconnected call's record")
    call = read_session(session["records"]).calls[0]
    assert call["status"] == "client_disconnected" and not call["usable_for_rl"]


def test_the_deadline_answers_504_and_excludes_the_rollout(proxy):
    session = proxy.open(deadline_s=0.3)
    wait_until(lambda: chat(session["base_url"]).status_code == 504, timeout=10, what="the deadline")
    info = httpx.get(f"{proxy.root}/sessions/{session['id']}", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert info["status"] == "timed_out"
    record = read_session(session["records"])
    assert record.status == "timed_out" and not record.trainable
    assert chat(session["base_url"]).status_code == 504  # and stays so


def test_sixty_four_concurrent_sessions_stay_apart(proxy):
    sessions = [proxy.open(sampling={"temperature": 0, "max_tokens": 1}) for _ in range(64)]

    async def one(http: httpx.AsyncClient, session: dict, number: int) -> int:
        body = {"model": "x", "messages": [{"role": "user", "content": f"Say {number}."}]}
        return (await http.post(f"{session['base_url']}/chat/completions", json=body)).status_code

    async def all_of_them() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(one(http, s, n) for n, s in enumerate(sessions)))

    assert asyncio.run(all_of_them()) == [200] * 64
    for number, session in enumerate(sessions):
        calls = read_session(session["records"]).calls
        assert len(calls) == 1 and calls[0]["request"]["messages"][0]["content"] == f"Say {number}."


def test_the_openai_sdk_and_litellm_are_clients(proxy):
    session = proxy.open(sampling={"temperature": 0, "max_tokens": 4})
    sdk = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    # A random policy's four tokens may decode to whitespace: what each client gets is the usage and the reason.
    chat_reply = sdk.chat.completions.create(model="x", messages=MESSAGES)
    assert chat_reply.usage.completion_tokens == 4 and chat_reply.choices[0].finish_reason == "length"
    assert sdk.completions.create(model="x", prompt="The sky is").choices[0].text is not None
    reply = litellm.completion(model="openai/x", api_base=f"{proxy.root}/v1", api_key=session["api_key"],
                               messages=MESSAGES)
    assert reply.usage.completion_tokens == 4 and reply.choices[0].finish_reason == "length"
    assert [c["path"] for c in read_session(session["records"]).calls] == [
        "/v1/chat/completions", "/v1/completions", "/v1/chat/completions"]


def test_a_torn_record_is_skipped_and_set_aside(tmp_path):
    path = str(tmp_path / "s.jsonl")
    with JsonlWriter(path) as writer:
        writer.write_record({"type": "session", "id": "s"})
        writer.write_record({"type": "call", "usable_for_rl": True, "status": "ok"})
    with open(path, "ab") as handle:
        handle.write(b'{"type": "call", "usa')  # the proxy killed mid-write
    record = read_session(path)
    assert len(record.calls) == 1 and record.report.torn_line == 3
    with JsonlWriter(path) as writer:  # a writer reopening the file moves the fragment aside
        writer.write_record({"type": "closed"})
    assert read_session(path).status == "closed" and os.path.exists(path + ".torn")
    assert Path(path + ".torn").read_text().startswith('{"type": "call"')


def test_records_are_served_to_a_trainer_on_another_machine(proxy):
    session = proxy.open(sampling={"temperature": 0, "max_tokens": 2})
    assert chat(session["base_url"]).status_code == 200
    proxy.close(session)
    earlier = Path(proxy.records, "0123456789abcdef.jsonl")  # a session of an earlier run of the proxy
    earlier.write_text('{"type":"session","id":"0123456789abcdef"}\n{"type":"call","usable_for_rl":true,'
                       '"status":"ok"}\n{"type":"ca')  # ... killed mid-write

    async def fetch(session_id: str, key: str = ADMIN):
        client = ProxyClient(proxy.root, key)
        try:
            return await client.records(session_id)
        finally:
            await client.aclose()

    served = asyncio.run(fetch(session["id"]))
    local = read_session(session["records"])
    assert served.calls == local.calls and served.status == "closed" and served.trainable
    old = asyncio.run(fetch("0123456789abcdef"))
    assert len(old.calls) == 1 and old.report.torn_line == 3 and old.status == "open"
    for bad in ("nosuchsession", "..%2F..%2Fetc%2Fpasswd", "0123456789ABCDEF"):
        answer = httpx.get(f"{proxy.root}/sessions/{bad}/records", headers={"Authorization": f"Bearer {ADMIN}"})
        assert answer.status_code == 404, bad
    assert httpx.get(f"{proxy.root}/sessions/{session['id']}/records").status_code == 401  # no admin key


def test_a_proxy_killed_mid_rollout_comes_back_with_its_open_sessions(policy_server, tmp_path):
    port, records = free_port(), str(tmp_path / "records")
    args = ["proxy", "--upstream", policy_server.url, "--records", records, "--admin-key", ADMIN, "--port", str(port)]
    proxy = Proxy(f"http://127.0.0.1:{port}", records)
    for process in cli_server(args, port, str(tmp_path / "first.log"), timeout=60):
        session = proxy.open(sampling={"temperature": 0, "max_tokens": 2}, deadline_s=600)
        finished = proxy.open()
        assert chat(session["base_url"]).status_code == 200
        proxy.close(finished)
        process.kill()  # no goodbye: the session is still open in its file
        process.wait(10)
    for _ in cli_server(args, port, str(tmp_path / "second.log"), timeout=60):
        assert chat(f"{proxy.root}/v1", key=session["api_key"]).status_code == 200  # the same key goes on
        assert chat(session["base_url"]).status_code == 200  # and the same URL
        assert chat(finished["base_url"]).status_code == 409  # a closed one stays closed
        proxy.close(session)
    record = read_session(session["records"])
    assert [c["call"] for c in record.calls] == [1, 2, 3] and record.status == "closed" and record.trainable
    assert all(c["upstream_request"]["max_tokens"] == 2 for c in record.calls)  # the trainer's sampling stands

"""The Orchard-Claw tool services: routes, audit log, admin, seeded faults, tool schemas and the CLI.

Most tests run the app in process; the ``services`` fixture runs the real process, from a copy of the
package named ``claw_services`` (which proves it is self-contained), for the process and CLI tests.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard.tasks.claw.services import PACKAGE_DIR, SANDBOX_NAME, create_app
from orchard.tasks.claw.services.faults import FaultInjector
from orchard.tasks.claw.services.routes import ROUTERS
from orchard.tasks.claw.services.tools import TOOLS, install_shims, openai_tools, request_for, tool_by_name

TOKEN = "test-admin-token"
ADMIN = {"X-Claw-Admin-Token": TOKEN}

CONFIG: dict[str, Any] = {
    "now": "2026-03-02T09:00:00",
    "fixtures": {
        "mail": {"messages": [
            {"id": "m1", "from": "alice@corp.example", "to": ["me@corp.example"], "subject": "Budget review",
             "body": "Please review the Q1 budget.", "date": "2026-03-01T08:00:00"},
            {"id": "m2", "from": "promo@shop.example", "to": ["me@corp.example"], "subject": "Sale!",
             "body": "50% off", "date": "2026-03-01T10:00:00", "read": True},
            {"id": "m3", "folder": "archive", "from": "bob@corp.example", "subject": "Old thread",
             "body": "done", "date": "2026-02-01T10:00:00"},
        ]},
        "calendar": {"events": [
            {"id": "e1", "title": "Standup", "start": "2026-03-02T09:30:00", "end": "2026-03-02T09:45:00",
             "attendees": ["alice@corp.example"]},
            {"id": "e2", "title": "Offsite", "start": "2026-03-05T09:00:00", "end": "2026-03-05T17:00:00"},
        ]},
        "contacts": {"contacts": [
            {"id": "c1", "name": "Alice Chen", "email": "alice@corp.example", "team": "Finance"},
            {"id": "c2", "name": "Bob Diaz", "email": "bob@corp.example", "team": "Platform", "phone": "555-0102"},
        ]},
        "todo": {"items": [
            {"id": "t1", "title": "File expenses", "due": "2026-03-03"},
            {"id": "t2", "title": "Book flights", "done": True},
        ]},
        "notifications": {"notifications": [
            {"id": "n1", "source": "bank", "title": "New sign-in", "date": "2026-03-02T07:00:00", "kind": "security"},
            {"id": "n2", "source": "social", "title": "3 likes", "date": "2026-03-02T08:00:00", "kind": "social",
             "read": True},
            {"id": "n3", "source": "shop", "title": "Deal", "date": "2026-03-01T08:00:00", "kind": "promo",
             "dismissed": True},
        ]},
        "documents": {"documents": [{"id": "d1", "title": "Notes", "content": "draft"}]},
    },
}


def client_for(config: dict[str, Any]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(create_app(config, TOKEN)), base_url="http://claw")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(CONFIG) as c:
        yield c


async def audit_of(c: httpx.AsyncClient) -> list[dict[str, Any]]:
    return (await c.get("/_admin/audit", headers=ADMIN)).json()["calls"]


async def state_of(c: httpx.AsyncClient) -> dict[str, Any]:
    return (await c.get("/_admin/state", headers=ADMIN)).json()


# -- the services -----------------------------------------------------------------------------------------


async def test_mail_list_filters_newest_first_without_bodies(client: httpx.AsyncClient) -> None:
    inbox = (await client.get("/mail/messages")).json()["messages"]
    assert [m["id"] for m in inbox] == ["m2", "m1"]
    assert "body" not in inbox[0] and inbox[0]["from"] == "promo@shop.example"
    unread = (await client.get("/mail/messages", params={"unread": "true"})).json()["messages"]
    assert [m["id"] for m in unread] == ["m1"]
    found = (await client.get("/mail/messages", params={"q": "q1 BUDGET"})).json()["messages"]
    assert [m["id"] for m in found] == ["m1"]
    archived = (await client.get("/mail/messages", params={"folder": "archive"})).json()["messages"]
    assert [m["id"] for m in archived] == ["m3"]


async def test_mail_writes_change_state(client: httpx.AsyncClient) -> None:
    assert (await client.get("/mail/messages/m1")).json()["body"] == "Please review the Q1 budget."
    sent = await client.post("/mail/send", json={"to": ["alice@corp.example"], "subject": "Re: Budget review",
                                                 "body": "Looks good.", "in_reply_to": "m1"})
    assert sent.json() == {"id": "msg-new-1", "status": "sent"}
    assert (await client.post("/mail/messages/m1/label", json={"label": "finance"})).json()["labels"] == ["finance"]
    assert (await client.post("/mail/messages/m1/read")).json()["read"] is True
    assert (await client.post("/mail/messages/m1/move", json={"folder": "archive"})).json()["folder"] == "archive"
    assert (await client.delete("/mail/messages/m2")).json()["folder"] == "trash"
    messages = {m["id"]: m for m in (await state_of(client))["mail"]["messages"]}
    assert messages["msg-new-1"] == {
        "id": "msg-new-1", "folder": "sent", "from": "me", "to": ["alice@corp.example"], "cc": [],
        "subject": "Re: Budget review", "body": "Looks good.", "date": "2026-03-02T09:00:00", "read": True,
        "labels": [], "in_reply_to": "m1",
    }
    assert (messages["m1"]["folder"], messages["m1"]["read"], messages["m2"]["folder"]) == ("archive", True, "trash")
    reply = await client.post("/mail/send", json={"to": ["x@y.z"], "subject": "s", "body": "b", "in_reply_to": "zz"})
    assert (reply.status_code, reply.json()) == (404, {"error": "no message 'zz'"})


async def test_calendar(client: httpx.AsyncClient) -> None:
    window = {"start": "2026-03-02T00:00:00", "end": "2026-03-03T00:00:00"}
    assert [e["id"] for e in (await client.get("/calendar/events", params=window)).json()["events"]] == ["e1"]
    assert len((await client.get("/calendar/events")).json()["events"]) == 2
    new = {"title": "1:1", "start": "2026-03-02T14:00:00", "end": "2026-03-02T14:30:00"}
    created = (await client.post("/calendar/events", json=new)).json()
    assert created == {**new, "id": "evt-new-1", "attendees": [], "location": ""}
    moved = await client.patch("/calendar/events/evt-new-1", json={"start": "2026-03-02T15:00:00",
                                                                 "end": "2026-03-02T15:30:00"})
    assert (moved.json()["start"], moved.json()["title"]) == ("2026-03-02T15:00:00", "1:1")
    backwards = await client.patch("/calendar/events/e1", json={"end": "2026-03-02T09:00:00"})
    assert (backwards.status_code, backwards.json()) == (400, {"error": "end: must be after start"})
    inverted = await client.post("/calendar/events", json={**new, "end": new["start"]})
    assert (inverted.status_code, inverted.json()) == (400, {"error": "end: must be after start"})
    assert (await client.delete("/calendar/events/e2")).json() == {"id": "e2", "status": "deleted"}
    assert [e["id"] for e in (await state_of(client))["calendar"]["events"]] == ["e1", "evt-new-1"]
    bad = await client.get("/calendar/events", params={"start": "tomorrow"})
    assert (bad.status_code, bad.json()) == (400, {"error": "start: not an ISO 8601 date-time: 'tomorrow'"})


async def test_contacts(client: httpx.AsyncClient) -> None:
    assert [c["id"] for c in (await client.get("/contacts", params={"q": "platform"})).json()["contacts"]] == ["c2"]
    assert len((await client.get("/contacts")).json()["contacts"]) == 2
    assert (await client.get("/contacts/c2")).json()["phone"] == "555-0102"
    assert (await client.get("/contacts/c9")).json() == {"error": "no contact 'c9'"}


async def test_todo(client: httpx.AsyncClient) -> None:
    assert [i["id"] for i in (await client.get("/todo/items", params={"done": "false"})).json()["items"]] == ["t1"]
    created = (await client.post("/todo/items", json={"title": "Call Bob", "due": "2026-03-04"})).json()
    assert created == {"id": "todo-new-1", "title": "Call Bob", "due": "2026-03-04", "notes": "", "done": False}
    assert (await client.post("/todo/items/t1/complete")).json()["done"] is True
    assert (await client.delete("/todo/items/t2")).json() == {"id": "t2", "status": "deleted"}
    assert [(i["id"], i["done"]) for i in (await state_of(client))["todo"]["items"]] == [
        ("t1", True), ("todo-new-1", False)]
    bad = await client.post("/todo/items", json={"title": "x", "due": "soon"})
    assert bad.json() == {"error": "due: Value error, not an ISO 8601 date: 'soon'"}


async def test_notifications(client: httpx.AsyncClient) -> None:
    assert [n["id"] for n in (await client.get("/notifications")).json()["notifications"]] == ["n2", "n1"]
    listed = await client.get("/notifications", params={"include_dismissed": "true", "unread": "true"})
    assert [n["id"] for n in listed.json()["notifications"]] == ["n1", "n3"]
    assert (await client.post("/notifications/n1/read")).json()["read"] is True
    assert (await client.post("/notifications/n2/dismiss")).json()["dismissed"] is True
    assert [n["id"] for n in (await client.get("/notifications")).json()["notifications"]] == ["n1"]


async def test_documents(client: httpx.AsyncClient) -> None:
    assert (await client.get("/documents")).json() == {"documents": [{"id": "d1", "title": "Notes"}]}
    assert (await client.put("/documents/d1", json={"content": "final"})).json()["content"] == "final"
    created = (await client.post("/documents", json={"title": "Plan", "content": "1. ship"})).json()
    assert created == {"id": "doc-new-1", "title": "Plan", "content": "1. ship"}
    assert (await client.get("/documents/doc-new-1")).json() == created
    assert [d["content"] for d in (await state_of(client))["documents"]["documents"]] == ["final", "1. ship"]


async def test_answer_is_recorded_and_not_readable_by_the_policy(client: httpx.AsyncClient) -> None:
    assert (await state_of(client))["answer"] is None
    assert (await client.post("/answer", json={"answer": "Done: 2 emails sent."})).json() == {"status": "recorded"}
    state = await state_of(client)
    assert (state["answer"], state["now"]) == ("Done: 2 emails sent.", "2026-03-02T09:00:00")
    assert (await client.get("/answer")).status_code == 405


async def test_new_ids_skip_ids_the_fixtures_hold() -> None:
    taken = {"fixtures": {"documents": {"documents": [{"id": "doc-new-1", "title": "t"}]}}}
    async with client_for(taken) as c:
        assert (await c.post("/documents", json={"title": "a", "content": ""})).json()["id"] == "doc-new-2"
        assert (await c.post("/documents", json={"title": "b", "content": ""})).json()["id"] == "doc-new-3"


# -- audit, errors, admin ---------------------------------------------------------------------------------


async def test_audit_entry(client: httpx.AsyncClient) -> None:
    await client.get("/health")
    await client.post("/mail/messages/m1/move?dry=1", json={"folder": "archive"})
    await client.get("/contacts/nobody")
    calls = await audit_of(client)
    assert calls[0] == {
        "seq": 1, "service": "mail", "method": "POST", "path": "/mail/messages/m1/move",
        "endpoint": "POST /mail/messages/{id}/move",
        "request": {"path_params": {"id": "m1"}, "query": {"dry": "1"}, "body": {"folder": "archive"}},
        "status": 200, "response": calls[0]["response"], "fault": None,
    }
    assert calls[0]["response"]["folder"] == "archive"
    assert [(c["seq"], c["endpoint"], c["status"], c["response"]) for c in calls[1:]] == [
        (2, "GET /contacts/{id}", 404, {"error": "no contact 'nobody'"})]


async def test_error_shapes(client: httpx.AsyncClient) -> None:
    missing = await client.post("/mail/send", json={"to": ["a@b.c"], "subject": "s"})
    assert (missing.status_code, missing.json()) == (400, {"error": "body: Field required"})
    wrong_method = await client.post("/documents/d1", json={"content": "x"})
    assert (wrong_method.status_code, wrong_method.json()) == (405, {"error": "method POST not allowed on /documents/d1"})
    unknown_field = await client.put("/documents/d1", json={"content": "x", "title": "y"})
    assert unknown_field.json() == {"error": "title: Extra inputs are not permitted"}
    bad_query = await client.get("/todo/items", params={"done": "maybe"})
    assert (bad_query.status_code, bad_query.json()["error"].split(":")[0]) == (400, "done")
    not_json = await client.post("/answer", content=b"{oops", headers={"Content-Type": "application/json"})
    assert (not_json.status_code, not_json.json()) == (400, {"error": "body: invalid JSON"})
    no_route = await client.get("/mail/nowhere")
    assert (no_route.status_code, no_route.json()) == (404, {"error": "no route GET /mail/nowhere"})
    calls = await audit_of(client)
    assert [c["status"] for c in calls] == [400, 405, 400, 400, 400, 404]
    assert (calls[4]["request"]["body"], calls[5]["endpoint"]) == ("{oops", None)


async def test_admin_needs_the_token(client: httpx.AsyncClient) -> None:
    for headers in ({}, {"X-Claw-Admin-Token": "wrong"}, {"Authorization": f"Bearer {TOKEN}"}):
        for method, path in (("GET", "/_admin/audit"), ("GET", "/_admin/state"), ("POST", "/_admin/reset")):
            reply = await client.request(method, path, headers=headers, json={})
            assert (reply.status_code, reply.json()) == (401, {"error": "admin token required"})
    assert await audit_of(client) == []
    with pytest.raises(ValueError, match="admin token"):
        create_app(CONFIG, "")


async def test_reset(client: httpx.AsyncClient) -> None:
    await client.post("/documents", json={"title": "a", "content": "b"})
    await client.post("/answer", json={"answer": "x"})
    other = {"now": "2026-04-01T12:00:00", "fixtures": {"todo": {"items": [{"id": "only", "title": "one"}]}}}
    assert (await client.post("/_admin/reset", headers=ADMIN, json=other)).json() == {"status": "reset"}
    state = await state_of(client)
    assert (state["answer"], state["now"], state["documents"], state["mail"]) == (
        None, "2026-04-01T12:00:00", {"documents": []}, {"messages": []})
    assert [i["id"] for i in state["todo"]["items"]] == ["only"]
    assert await audit_of(client) == []
    assert (await client.post("/documents", json={"title": "a", "content": "b"})).json()["id"] == "doc-new-1"


async def test_bad_config_names_the_field(client: httpx.AsyncClient) -> None:
    bad = {"fault_rate": 2, "fixtures": {"mail": {"messages": [{"id": "m1", "date": "yesterday"}]}}}
    reply = await client.post("/_admin/reset", headers=ADMIN, json=bad)
    assert reply.status_code == 400
    assert "fault_rate: " in reply.json()["error"]
    assert "fixtures.mail.messages.0.date: " in reply.json()["error"]
    with pytest.raises(ValueError, match=r"fixtures\.todo\.items: Value error, duplicate id 't'"):
        create_app({"fixtures": {"todo": {"items": [{"id": "t", "title": "a"}, {"id": "t", "title": "b"}]}}}, TOKEN)
    with pytest.raises(ValueError, match="fault_kinds: Extra inputs"):
        create_app({"fault_kinds": ["slow"]}, TOKEN)


# -- faults -----------------------------------------------------------------------------------------------


async def fault_trace(config: dict[str, Any]) -> list[tuple[str, int, str | None]]:
    """The (endpoint, status, fault) of a fixed sequence of calls."""
    async with client_for(config) as c:
        for _ in range(12):
            await c.get("/mail/messages")
            await c.get("/contacts", params={"q": "a"})
            await c.post("/todo/items", json={"title": "x"})
        return [(call["endpoint"], call["status"], call["fault"]) for call in await audit_of(c)]


async def test_faults_repeat_with_the_same_seed_and_differ_with_another() -> None:
    config = {**CONFIG, "seed": 3, "fault_rate": 0.5, "slow_seconds": 0.0}
    first, again = await fault_trace(config), await fault_trace(config)
    assert first == again
    assert {fault for _, _, fault in first} == {None, "rate_limit", "server_error", "slow"}
    assert {(fault, status) for _, status, fault in first if fault} == {
        ("rate_limit", 429), ("server_error", 500), ("slow", 200)}
    assert await fault_trace({**config, "seed": 4}) != first
    assert {fault for _, _, fault in await fault_trace({**config, "fault_rate": 0.0})} == {None}


def test_fault_draws_count_per_endpoint() -> None:
    alone = FaultInjector(seed=1, rate=0.5, kinds=["rate_limit"])
    mixed = FaultInjector(seed=1, rate=0.5, kinds=["rate_limit"])
    expected = [alone.next_fault("GET /contacts") for _ in range(20)]
    observed = []
    for _ in range(20):
        mixed.next_fault("GET /todo/items")
        observed.append(mixed.next_fault("GET /contacts"))
    assert observed == expected and "rate_limit" in expected and None in expected


async def test_injected_errors_change_nothing_and_rate_limits_say_when_to_retry() -> None:
    for kind, status, error in (("rate_limit", 429, "rate limited"), ("server_error", 500, "internal error")):
        config = {**CONFIG, "fault_rate": 1.0, "faults": [kind], "retry_after_seconds": 7}
        async with client_for(config) as c:
            before = await state_of(c)
            reply = await c.post("/mail/messages/m1/move", json={"folder": "trash"})
            assert (reply.status_code, reply.json()) == (status, {"error": error})
            assert reply.headers.get("Retry-After") == ("7" if kind == "rate_limit" else None)
            assert await state_of(c) == before
            assert (await c.post("/answer", json={"answer": "a"})).status_code == 200
            assert (await c.get("/health")).status_code == 200
            assert [(call["fault"], call["status"]) for call in await audit_of(c)] == [(kind, status), (None, 200)]


async def test_slow_fault_delays_then_serves() -> None:
    config = {**CONFIG, "fault_rate": 1.0, "faults": ["slow"], "slow_seconds": 0.05}
    async with client_for(config) as c:
        started = time.perf_counter()
        reply = await c.post("/mail/messages/m1/read")
        assert time.perf_counter() - started >= 0.05
        assert reply.json()["read"] is True
        assert (await audit_of(c))[0]["fault"] == "slow"


async def test_reset_restarts_the_fault_counters() -> None:
    config = {**CONFIG, "seed": 5, "fault_rate": 0.5, "faults": ["server_error"]}
    async with client_for(config) as c:
        first = [(await c.get("/documents")).status_code for _ in range(10)]
        await c.post("/_admin/reset", headers=ADMIN, json=config)
        assert [(await c.get("/documents")).status_code for _ in range(10)] == first
        assert set(first) == {200, 500}


# -- tool schemas -----------------------------------------------------------------------------------------


def test_every_tool_has_its_route_and_every_route_its_tool() -> None:
    routes = {(method, route.path) for router in ROUTERS for route in router.routes for method in route.methods}
    assert {(spec.method, spec.path) for spec in TOOLS} == routes
    assert len({spec.name for spec in TOOLS}) == len(TOOLS) == 25


def test_openai_tools_and_tool_by_name() -> None:
    assert len(openai_tools()) == len(TOOLS)
    [send] = openai_tools(["mail_send"])
    assert send["type"] == "function"
    assert send["function"]["name"] == "mail_send"
    assert send["function"]["parameters"]["required"] == ["to", "subject", "body"]
    assert send["function"]["parameters"]["properties"]["to"]["type"] == "array"
    assert tool_by_name("finish").path == "/answer"
    with pytest.raises(KeyError, match="no tool 'mail_fly'; the tools are: mail_list"):
        tool_by_name("mail_fly")


def test_request_for() -> None:
    assert request_for("mail_list", {"unread": True, "q": None}) == ("GET", "/mail/messages", {"unread": "true"}, None)
    assert request_for(tool_by_name("mail_move"), {"id": "a/b c", "folder": "archive"}) == (
        "POST", "/mail/messages/a%2Fb%20c/move", {}, {"folder": "archive"})
    assert request_for("calendar_delete", {"id": "e1"}) == ("DELETE", "/calendar/events/e1", {}, None)
    assert request_for("todo_complete", {"id": "t1"}) == ("POST", "/todo/items/t1/complete", {}, {})
    with pytest.raises(ValueError, match=r"missing required argument.*: subject"):
        request_for("mail_send", {"to": ["a@b.c"], "body": "x"})
    with pytest.raises(ValueError, match=r"unknown argument.*: bcc"):
        request_for("mail_send", {"to": ["a@b.c"], "subject": "s", "body": "x", "bcc": ["d@e.f"]})


# -- the real process and the CLI -------------------------------------------------------------------------


@dataclass
class Services:
    url: str
    env: dict[str, str]  # for subprocesses: the package on PYTHONPATH, CLAW_SERVICES_URL
    package_parent: Path
    token_file: Path
    seconds_to_healthy: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_services(root: Path, config: dict[str, Any]) -> tuple[subprocess.Popen, Services]:
    """Copy the package to ``root/claw_services``, start it and wait until it is healthy."""
    shutil.copytree(PACKAGE_DIR, root / SANDBOX_NAME, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "config.json").write_text(json.dumps(config))
    (root / "token").write_text(TOKEN)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(root), "CLAW_SERVICES_URL": f"http://127.0.0.1:{port}"}
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", SANDBOX_NAME, "--port", str(port), "--config", str(root / "config.json"),
         "--admin-token-file", str(root / "token")],
        env=env, cwd=root, stderr=subprocess.PIPE, text=True)
    url = env["CLAW_SERVICES_URL"]
    with httpx.Client(trust_env=False) as http:
        while True:
            if process.poll() is not None:
                pytest.fail(f"the services exited ({process.returncode}): {process.stderr.read()}")
            try:
                if http.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.perf_counter() - started > 30:
                process.kill()
                pytest.fail("the services were not healthy within 30 s")
            time.sleep(0.01)
    seconds = time.perf_counter() - started
    print(f"claw_services: healthy {seconds:.2f} s after start")
    return process, Services(url, env, root, root / "token", seconds)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    process, services = start_services(tmp_path_factory.mktemp("claw"), CONFIG)
    yield services
    process.terminate()
    process.wait(timeout=10)
    process.stderr.close()


@pytest.fixture
def services(running: Services) -> Services:
    """The real process, reset to ``CONFIG``."""
    httpx.post(f"{running.url}/_admin/reset", headers=ADMIN, json=CONFIG, trust_env=False).raise_for_status()
    return running


def test_the_real_process(services: Services) -> None:
    assert not services.token_file.exists()
    with httpx.Client(base_url=services.url, trust_env=False) as http:
        assert http.get("/contacts/c1").json()["name"] == "Alice Chen"
        assert http.get("/_admin/audit").status_code == 401
        [call] = http.get("/_admin/audit", headers=ADMIN).json()["calls"]
    assert (call["endpoint"], call["status"]) == ("GET /contacts/{id}", 200)


def cli(services: Services, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"{SANDBOX_NAME}.cli", *args], env=services.env,
                          capture_output=True, text=True, timeout=30)


def test_cli(services: Services) -> None:
    sent = cli(services, "mail_send", "--to", "a@x.org,b@x.org", "--to", "c@x.org", "--subject", "Hi",
               "--body", "Hello", "--in-reply-to", "m1")
    assert (sent.returncode, json.loads(sent.stdout)) == (0, {"id": "msg-new-1", "status": "sent"})
    unread = cli(services, "mail_list", "--unread", "true")
    assert [m["id"] for m in json.loads(unread.stdout)["messages"]] == ["m1"]
    created = cli(services, "todo_create", "--json", '{"title": "Call Bob", "notes": "re budget"}')
    assert json.loads(created.stdout)["id"] == "todo-new-1"
    state = httpx.get(f"{services.url}/_admin/state", headers=ADMIN, trust_env=False).json()
    assert state["mail"]["messages"][-1]["to"] == ["a@x.org", "b@x.org", "c@x.org"]
    listed = cli(services, "--list")
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == len(TOOLS)
    assert listed.stdout.startswith("mail_list ")


def test_cli_errors(services: Services) -> None:
    missing = cli(services, "contacts_get", "--id", "c9")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr.strip() == 'HTTP 404: {"error":"no contact \'c9\'"}'
    for usage in (["mail_read"], ["mail_fly"], ["mail_list", "--unread", "maybe"], ["todo_list", "--json", "[1]"], []):
        assert cli(services, *usage).returncode == 2, usage
    httpx.post(f"{services.url}/_admin/reset", headers=ADMIN, trust_env=False,
               json={"fault_rate": 1.0, "faults": ["rate_limit"], "retry_after_seconds": 3}).raise_for_status()
    limited = cli(services, "documents_list")
    assert limited.returncode == 1 and limited.stderr.startswith("HTTP 429 (Retry-After: 3): ")


def test_install_shims(services: Services, tmp_path: Path) -> None:
    paths = install_shims(str(tmp_path / "bin"), sys.executable, str(services.package_parent))
    assert [Path(p).name for p in paths] == [spec.name for spec in TOOLS] + ["claw-tools"]
    assert all(os.access(p, os.X_OK) for p in paths)
    env = {**services.env, "PYTHONPATH": ""}  # the shim brings the package itself
    reply = subprocess.run([str(tmp_path / "bin" / "contacts_search"), "--q", "finance"], env=env,
                           capture_output=True, text=True, timeout=30)
    assert reply.returncode == 0, reply.stderr
    assert [c["id"] for c in json.loads(reply.stdout)["contacts"]] == ["c1"]
    listing = subprocess.run([str(tmp_path / "bin" / "claw-tools")], env=env, capture_output=True, text=True,
                             timeout=30)
    assert listing.returncode == 0 and all(spec.name in listing.stdout for spec in TOOLS)

"""The agent as a real process on a Unix socket: auth, files, tar, patches, processes, memory bounds."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile

import httpx
import pytest

from tests.conftest import wait_until

MiB = 1 << 20


def problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code and body["status"] == status
    return body


# ---------------------------------------------------------------------- auth


def test_health_is_open_but_everything_else_needs_the_token(agent):
    socket_transport = agent.http._transport
    anonymous = httpx.Client(transport=socket_transport, base_url="http://agent")
    assert anonymous.get("/health").json()["status"] == "ok"
    problem(anonymous.post("/exec", json={"command": "true"}), 401, "unauthorized")
    wrong = anonymous.post("/exec", json={"command": "true"}, headers={"Authorization": "Bearer nope"})
    problem(wrong, 401, "unauthorized")


def test_malformed_requests_get_problem_details(agent):
    problem(agent.http.post("/exec", content=b"{not json", headers={"content-type": "application/json"}),
            422, "invalid_request")
    problem(agent.http.post("/exec", json={"command": ""}), 422, "invalid_request")
    problem(agent.http.post("/exec", json={"command": "true", "timeout": -1}), 422, "invalid_request")
    problem(agent.http.post("/exec", json={"command": "true", "env": {"A=B": "x"}}), 422, "invalid_request")
    problem(agent.http.post("/exec", json={"command": "true", "cwd": "/nope"}), 400, "not_a_directory")
    problem(agent.http.get("/processes/doesnotexist"), 404, "process_not_found")
    problem(agent.http.get("/no/such/route"), 404, "not_found")


# --------------------------------------------------------------------- exec


def test_exec_binary_output_is_base64_and_intact(agent):
    body = agent.http.post("/exec", json={"command": ["printf", "\\377\\000\\376"]}).json()
    assert body["stdout_encoding"] == "base64"
    assert base64.b64decode(body["stdout"]) == b"\xff\x00\xfe"


def test_gigabyte_of_output_is_capped_with_bounded_memory(agent):
    before = agent.peak_rss()
    body = agent.http.post("/exec", json={"command": "head -c 1073741824 /dev/zero",
                                           "max_output_bytes": MiB, "timeout": 120}).json()
    assert body["exit_code"] == 0 and body["truncated"] is True
    assert body["stdout_total"] == 1 << 30
    assert len(body["stdout"]) < MiB + 100
    assert "bytes truncated" in body["stdout"]
    assert agent.peak_rss() - before < 64 * MiB


def test_stream_delivers_chunks_before_the_command_ends(agent, tmp_path):
    gate = tmp_path / "gate"
    command = f"echo first; while [ ! -e {gate} ]; do sleep 0.01; done; echo second; exit 3"
    events = []
    with agent.http.stream("POST", "/exec/stream", json={"command": command, "timeout": 30}) as response:
        for line in response.iter_lines():
            event = json.loads(line)
            events.append(event)
            if event["data"] == "first\n":
                gate.touch()  # only possible because "first" arrived while the command was blocked
    assert [e["type"] for e in events] == ["stdout", "stdout", "exit"]
    assert events[-1]["exit_code"] == 3


# -------------------------------------------------------------------- files


def test_binary_file_round_trip(agent):
    payload = os.urandom(100_000) + b"\x00\xff"
    info = agent.http.put("/files", params={"path": "/workspace/blob.bin", "mode": 0o600}, content=payload).json()
    assert info["size"] == len(payload) and info["mode"] == 0o600 and info["type"] == "file"
    assert agent.http.get("/files", params={"path": "/workspace/blob.bin"}).content == payload
    listing = agent.http.get("/files/list", params={"path": "/workspace"}).json()
    assert [entry["name"] for entry in listing] == ["blob.bin"]
    assert agent.http.get("/files/stat", params={"path": "blob.bin"}).json()["size"] == len(payload)


def test_write_creates_parents_and_replaces_atomically(agent):
    agent.http.put("/files", params={"path": "/workspace/a/b/c.txt"}, content=b"one")
    agent.http.put("/files", params={"path": "/workspace/a/b/c.txt"}, content=b"two")
    assert agent.http.get("/files", params={"path": "/workspace/a/b/c.txt"}).content == b"two"
    assert os.listdir(os.path.join(agent.root, "workspace/a/b")) == ["c.txt"]  # no temp files left


def test_hundred_megabyte_file_is_streamed(agent):
    size, chunk = 100 * MiB, os.urandom(MiB)
    before = agent.peak_rss()
    sent, received = hashlib.sha256(), hashlib.sha256()

    def body():
        for _ in range(size // MiB):
            sent.update(chunk)
            yield chunk

    info = agent.http.put("/files", params={"path": "/workspace/big.bin"}, content=body()).json()
    assert info["size"] == size
    with agent.http.stream("GET", "/files", params={"path": "/workspace/big.bin"}) as response:
        assert response.headers["content-length"] == str(size)
        for part in response.iter_bytes():
            received.update(part)
    assert received.hexdigest() == sent.hexdigest()
    assert agent.peak_rss() - before < 48 * MiB


def test_missing_files_and_directories(agent):
    problem(agent.http.get("/files", params={"path": "/workspace/nope"}), 404, "path_not_found")
    problem(agent.http.get("/files", params={"path": "/workspace"}), 400, "is_a_directory")
    problem(agent.http.get("/files/list", params={"path": "/workspace/nope"}), 404, "path_not_found")
    agent.http.put("/files", params={"path": "/workspace/f"}, content=b"x")
    problem(agent.http.put("/files", params={"path": "/workspace/f/g"}, content=b"x"), 400, "not_a_directory")
    problem(agent.http.put("/archive", params={"path": "/workspace/f"}, content=b""), 400, "not_a_directory")
    problem(agent.http.put("/files", params={"path": "/workspace/" + "x" * 300}, content=b"x"), 400,
            "invalid_request")
    assert agent.http.delete("/files", params={"path": "/workspace/f"}).status_code == 204
    problem(agent.http.delete("/files", params={"path": "/workspace/f"}), 404, "path_not_found")


@pytest.mark.parametrize("path", ["/../outside.txt", "../../outside.txt", "/workspace/../../outside.txt"])
def test_traversal_is_refused(agent, path):
    problem(agent.http.put("/files", params={"path": path}, content=b"x"), 403, "path_outside_sandbox")
    problem(agent.http.get("/files", params={"path": path}), 403, "path_outside_sandbox")
    assert not os.path.exists(os.path.join(os.path.dirname(agent.root), "outside.txt"))


def test_symlink_escapes_are_refused(agent, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    workspace = os.path.join(agent.root, "workspace")
    os.symlink(str(secret), os.path.join(workspace, "to_secret"))
    os.symlink(str(tmp_path), os.path.join(workspace, "to_host_dir"))
    problem(agent.http.get("/files", params={"path": "/workspace/to_secret"}), 403, "path_outside_sandbox")
    problem(agent.http.put("/files", params={"path": "/workspace/to_secret"}, content=b"pwned"), 403,
            "path_outside_sandbox")
    problem(agent.http.put("/files", params={"path": "/workspace/to_host_dir/new"}, content=b"x"), 403,
            "path_outside_sandbox")
    problem(agent.http.get("/files/list", params={"path": "/workspace/to_host_dir"}), 403, "path_outside_sandbox")
    assert secret.read_text() == "host secret" and not (tmp_path / "new").exists()
    # The link itself is inside: it can be stat'ed and removed.
    assert agent.http.get("/files/stat", params={"path": "/workspace/to_secret"}).json()["type"] == "symlink"
    assert agent.http.delete("/files", params={"path": "/workspace/to_secret"}).status_code == 204
    assert secret.exists()


# ---------------------------------------------------------------------- tar


def make_tar(members: dict[str, bytes], symlinks: dict[str, str] | None = None, mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    return buffer.getvalue()


def test_tar_round_trip(agent):
    files = {"pkg/__init__.py": b"", "pkg/mod.py": b"x = 1\n", "data/blob.bin": os.urandom(5000)}
    response = agent.http.put("/archive", params={"path": "/workspace/repo"}, content=make_tar(files))
    assert response.status_code == 200, response.text
    downloaded = agent.http.get("/archive", params={"path": "/workspace/repo"}).content
    with tarfile.open(fileobj=io.BytesIO(downloaded)) as archive:
        got = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}
    assert got == files


# Explicit ids: a gzip header holds its write time, so ids made from the bytes differ between two pytest-xdist
# workers that collect a second apart, and xdist then refuses the whole run.
@pytest.mark.parametrize("archive", [
    make_tar({"../escape.txt": b"x"}),
    make_tar({"/abs/escape.txt": b"x"}, mode="w"),
    make_tar({}, symlinks={"link": "/etc"}),
    make_tar({}, symlinks={"link": "../../.."}),
], ids=["parent-path", "absolute-path", "absolute-symlink", "parent-symlink"])
def test_tar_members_that_escape_are_refused(agent, archive):
    response = agent.http.put("/archive", params={"path": "/workspace/dest"}, content=archive)
    problem(response, 403, "path_outside_sandbox")
    assert not os.path.exists(os.path.join(os.path.dirname(agent.root), "escape.txt"))
    assert not os.path.exists("/abs/escape.txt")


def test_garbage_tar_is_a_clear_error(agent):
    problem(agent.http.put("/archive", params={"path": "/workspace/d"}, content=b"not a tar"), 400,
            "invalid_request")


# -------------------------------------------------------------------- patch

ORIGINAL = "".join(f"line {i}\n" for i in range(1, 21))


def test_patch_applies_with_git(agent):
    agent.http.put("/files", params={"path": "/workspace/f.txt"}, content=ORIGINAL.encode())
    diff = "--- a/f.txt\n+++ b/f.txt\n@@ -2,3 +2,3 @@\n line 2\n-line 3\n+LINE THREE\n line 4\n"
    result = agent.http.post("/patch", json={"diff": diff}).json()
    assert result["applied"] and result["method"] == "git" and result["files"] == ["f.txt"]
    assert "LINE THREE" in agent.http.get("/files", params={"path": "/workspace/f.txt"}).text


def test_patch_falls_back_to_fuzzy_patch(agent):
    shifted = "header\n" * 5 + ORIGINAL
    agent.http.put("/files", params={"path": "/workspace/f.txt"}, content=shifted.encode())
    # Wrong line numbers and one line of stale context: git apply refuses, patch --fuzz accepts.
    diff = ("--- a/f.txt\n+++ b/f.txt\n@@ -9,5 +9,5 @@\n line 9\n line 10\n-line 11\n+LINE ELEVEN\n"
            " line 12\n stale context\n")
    result = agent.http.post("/patch", json={"diff": diff}).json()
    assert result["applied"] and result["method"] == "patch", result
    assert "LINE ELEVEN" in agent.http.get("/files", params={"path": "/workspace/f.txt"}).text


def test_rejected_hunks_are_reported_and_nothing_changes(agent):
    agent.http.put("/files", params={"path": "/workspace/f.txt"}, content=ORIGINAL.encode())
    diff = ("--- a/f.txt\n+++ b/f.txt\n"
            "@@ -2,3 +2,3 @@\n line 2\n-line 3\n+LINE THREE\n line 4\n"
            "@@ -15,3 +15,3 @@\n nothing\n-like\n+this\n here\n")
    result = agent.http.post("/patch", json={"diff": diff}).json()
    assert not result["applied"] and result["method"] is None
    assert [(r["file"], r["header"]) for r in result["rejected"]] == [("f.txt", "@@ -15,3 +15,3 @@")]
    assert "-like" in result["rejected"][0]["text"]
    assert agent.http.get("/files", params={"path": "/workspace/f.txt"}).text == ORIGINAL  # all or nothing


# ----------------------------------------------------------------- processes


def test_background_process_lifecycle(agent, tmp_path):
    gate = tmp_path / "gate"
    started = agent.http.post("/processes", json={
        "command": f"echo ready; while [ ! -e {gate} ]; do sleep 0.01; done; echo bye; exit 4",
        "name": "server"}).json()
    assert started["running"] and started["name"] == "server"
    process_id = started["id"]
    wait_until(lambda: agent.http.get(f"/processes/{process_id}/logs").content == b"ready\n", what="log")
    gate.touch()
    done = wait_until(lambda: (info := agent.http.get(f"/processes/{process_id}").json())["exit_code"] is not None
                      and info, what="process exit")
    assert done["exit_code"] == 4 and not done["running"]
    logs = agent.http.get(f"/processes/{process_id}/logs", params={"offset": 6})
    assert logs.content == b"bye\n" and logs.headers["x-orchard-next-offset"] == "10"
    assert [p["id"] for p in agent.http.get("/processes").json()] == [process_id]


def test_killing_a_background_process_kills_its_group(agent):
    started = agent.http.post("/processes", json={"command": "sleep 1000 & sleep 1000"}).json()
    killed = agent.http.delete(f"/processes/{started['id']}").json()
    assert killed["id"] == started["id"]
    done = wait_until(lambda: not (info := agent.http.get(f"/processes/{started['id']}").json())["running"]
                      and info, what="kill")
    assert done["exit_code"] == -9
    problem(agent.http.delete(f"/processes/{started['id']}", params={"signal": 999}), 400, "invalid_request")


# ------------------------------------------------------------ the fast path


async def test_exec_answers_alike_through_the_fast_path_and_through_fastapi(tmp_path):
    """``POST /exec`` is served by :class:`~orchard.env.fastpath.FastRoutes`; the FastAPI route behind it
    (the schema's, and what an app run without the fast path serves) gives the same answers."""
    from orchard.env.agent.app import AgentConfig, create_app
    from orchard.env.fastpath import FastRoutes

    (tmp_path / "root" / "workspace").mkdir(parents=True)
    app = create_app(AgentConfig(token="t", root=str(tmp_path / "root"), state_dir=str(tmp_path / "state")))
    assert isinstance(app.app, FastRoutes)
    fastapi_app = app.app.app
    requests = [{"command": "printf out; printf err >&2; exit 3", "env": {"X": "1"}}, {"command": ""},
                {"command": "true", "cwd": "/nope"}, {"command": "cat", "stdin": "in"}]
    answers = {}
    async with fastapi_app.router.lifespan_context(fastapi_app):
        for name, served in (("fast", app), ("fastapi", fastapi_app)):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://agent",
                                         headers={"Authorization": "Bearer t"}) as client:
                answers[name] = [(r.status_code, r.json()) for r in
                                 [await client.post("/exec", json=body) for body in requests]]
    for answer in answers.values():
        for _, body in answer:
            body.pop("duration", None)
    assert answers["fast"] == answers["fastapi"]
    (ok, result), (invalid, problem_), (missing, _), (_, piped) = answers["fast"]
    assert (ok, result["exit_code"], result["stdout"], result["stderr"]) == (200, 3, "out", "err")
    assert invalid == 422 and problem_["detail"].startswith("body.command: ")
    assert missing == 400 and piped["stdout"] == "in"


async def test_routes_built_once_serve_the_sandbox_they_are_bound_to(tmp_path):
    """The zygote builds the agent's routes once and each sandbox it forks binds them to itself
    (:class:`~orchard.env.agent.app.AgentRoutes`): a binding replaces the last, and unbound routes say so."""
    from orchard.env.agent.app import AgentConfig, AgentRoutes

    routes = AgentRoutes()
    with pytest.raises(RuntimeError, match="serve no sandbox yet"):
        routes.box()
    answers = []
    for name in ("first", "second"):
        (tmp_path / name / "workspace").mkdir(parents=True)
        (tmp_path / name / "workspace" / "who").write_text(name)
        app = routes.serve(AgentConfig(token=name, root=str(tmp_path / name), state_dir=str(tmp_path / f"{name}-state"),
                                       env=(("WHO", name),)))
        async with routes.app.router.lifespan_context(routes.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://agent",
                headers={"Authorization": f"Bearer {name}"}) as client:
            read = await client.get("/files", params={"path": "/workspace/who"})
            ran = await client.post("/exec", json={"command": "echo $WHO"})
            refused = await client.post("/exec", json={"command": "true"}, headers={"Authorization": "Bearer first"})
            answers.append((read.text, ran.json()["stdout"], refused.status_code))
    assert answers == [("first", "first\n", 200), ("second", "second\n", 401)]

"""The agent's exec core, run in-process: caps, stdin, timeouts, process groups, odd pipes."""

from __future__ import annotations

import asyncio
import os

import pytest

from orchard.env.agent.children import OOM_SCORE_ADJ, REAPER
from orchard.env.agent.execution import CappedBuffer, Outcome, run
from tests.conftest import process_alive, wait_until


@pytest.fixture(scope="module", autouse=True)
async def reaper():
    REAPER.install(asyncio.get_running_loop())
    yield
    REAPER.uninstall()


async def execute(command, *, cwd="/tmp", env=None, stdin=None, timeout=10.0, cap=1 << 20):
    out, err = CappedBuffer(cap), CappedBuffer(cap)
    outcome = await run(command, cwd=cwd, env=env or dict(os.environ), stdin=stdin, timeout=timeout,
                        stdout_sink=out.write, stderr_sink=err.write)
    return outcome, out, err


async def test_capped_buffer_keeps_head_and_tail():
    buffer = CappedBuffer(10)
    for chunk in (b"0123", b"4567", b"89ab", b"cdef"):
        await buffer.write(chunk)
    assert buffer.total == 16 and buffer.truncated
    value = buffer.getvalue()
    assert value.startswith(b"01234") and value.endswith(b"bcdef")
    assert b"6 bytes truncated" in value


async def test_capped_buffer_below_cap_is_exact():
    buffer = CappedBuffer(100)
    await buffer.write(b"hello ")
    await buffer.write(b"world")
    assert buffer.getvalue() == b"hello world" and not buffer.truncated


async def test_exit_code_stdout_stderr():
    outcome, out, err = await execute("echo out; echo err >&2; exit 7")
    assert outcome.exit_code == 7 and not outcome.timed_out
    assert out.getvalue() == b"out\n" and err.getvalue() == b"err\n"


async def test_argv_command_is_not_shell_parsed():
    outcome, out, _ = await execute(["printf", "%s|", "a b", "$HOME", ";"])
    assert outcome.exit_code == 0
    assert out.getvalue() == b"a b|$HOME|;|"


async def test_stdin_env_and_cwd(tmp_path):
    outcome, out, _ = await execute('cat; printf "%s:%s" "$GREETING" "$(pwd)"', cwd=str(tmp_path),
                                    env={"PATH": os.environ["PATH"], "GREETING": "hi"}, stdin=b"from stdin\n")
    assert outcome.exit_code == 0
    assert out.getvalue() == f"from stdin\nhi:{tmp_path}".encode()


async def test_large_stdin_does_not_deadlock():
    data = os.urandom(3 << 20)
    outcome, out, _ = await execute("wc -c", stdin=data)
    assert outcome.exit_code == 0 and out.getvalue().strip() == str(len(data)).encode()


async def test_binary_output_is_intact():
    payload = bytes(range(256)) * 4
    outcome, out, _ = await execute(["cat"], stdin=payload)
    assert outcome.exit_code == 0 and out.getvalue() == payload


async def test_output_is_capped_and_counted():
    outcome, out, _ = await execute("head -c 10000000 /dev/zero", cap=1000)
    assert outcome.exit_code == 0
    assert out.total == 10_000_000 and out.truncated
    assert len(out.getvalue()) < 1100


async def test_timeout_kills_background_child_and_grandchild(tmp_path):
    script = (f"sleep 1000 & echo $! > {tmp_path}/child; "
              f"sh -c 'sleep 1000 & echo $! > {tmp_path}/grandchild; wait' & "
              "sleep 1000")
    outcome, _, _ = await execute(script, timeout=0.5)
    assert outcome.timed_out and outcome.exit_code == -9
    child = int((tmp_path / "child").read_text())
    grandchild = int(wait_until(lambda: (tmp_path / "grandchild").read_text().strip(), what="grandchild pid"))
    wait_until(lambda: not process_alive(child) and not process_alive(grandchild), what="process group to die")


async def test_partial_output_survives_timeout():
    outcome, out, _ = await execute("echo before; sleep 1000", timeout=0.3)
    assert outcome.timed_out and out.getvalue() == b"before\n"


async def test_closed_stdout_still_waits_for_exit():
    outcome, out, err = await execute("echo early; exec 1>&-; sleep 0.3; echo late >&2", timeout=10)
    assert outcome == Outcome(exit_code=0, timed_out=False, duration=outcome.duration)
    assert out.getvalue() == b"early\n" and err.getvalue() == b"late\n"


async def test_background_child_holding_pipes_does_not_block(tmp_path):
    outcome, out, _ = await execute(f"sleep 1000 & echo $! > {tmp_path}/pid; echo done", timeout=30)
    assert outcome.exit_code == 0 and not outcome.timed_out
    assert out.getvalue() == b"done\n"
    os.kill(int((tmp_path / "pid").read_text()), 9)


async def test_commands_get_a_high_oom_score():
    _, out, _ = await execute("cat /proc/self/oom_score_adj")
    assert int(out.getvalue()) == OOM_SCORE_ADJ


async def test_reaper_collects_orphans(tmp_path):
    # The command's child outlives it; whoever reaps it, no zombie may stay behind for long.
    outcome, _, _ = await execute(f"sh -c 'echo $$ > {tmp_path}/orphan; exit 0' &", timeout=10)
    assert outcome.exit_code == 0
    orphan = int(wait_until(lambda: (tmp_path / "orphan").read_text().strip(), what="orphan pid"))
    wait_until(lambda: not process_alive(orphan), what="orphan to be reaped")


async def test_missing_cwd_fails_cleanly():
    with pytest.raises(FileNotFoundError):
        await execute("true", cwd="/nonexistent/dir")
    outcome, _, _ = await execute("true")  # nothing leaked, still works
    assert outcome.exit_code == 0

"""Harnesses Orchard does not control, run as their own processes, their model calls recorded.

A harness that speaks the OpenAI API (a CLI, someone else's Python loop, a binary) becomes a source
of graded, trainable episodes: :func:`run_external_episode` runs one, :class:`ExternalRunner` many
(the same ``run_one`` as :class:`~orchard.harness.episode.EpisodeRunner`, so RL workers, collection
and evaluation take either).

One episode:

1. a sandbox of the task family's spec, set up (or forked from its set-up snapshot);
2. a session of the recording proxy (:mod:`orchard.rollout.proxy`) for the rollout: its deadline is
   the harness's wall clock, its sampling the trainer's (the episode seed as the session's seed);
3. the harness's command as a process **beside** the sandbox, in a process group of its own. It
   gets, in its environment and in ``{placeholders}`` of its command: ``base_url`` and ``api_key``
   (the session's; also ``OPENAI_BASE_URL``/``OPENAI_API_BASE``/``OPENAI_API_KEY``), ``model``,
   ``orchard_url``, ``orchard_api_key`` and ``sandbox_id`` (where its tools run commands:
   ``ORCHARD_URL``, ``ORCHARD_API_KEY``, ``ORCHARD_SANDBOX_ID``), ``task_file`` (the task's prompt
   in the harness's ``task_template``, also ``ORCHARD_TASK_FILE``) and ``output_dir``
   (``ORCHARD_OUTPUT_DIR``). The whole group is killed
   when the wall clock runs out or the caller is cancelled;
4. the session is closed and read back, and the trajectory assembled from its calls
   (:func:`trajectory_from_calls`): every assistant message carries the ids and logprobs the
   upstream sampled, ``metadata["recorded_prompt_ids"]`` the prompt ids of each, from which SFT
   and GRPO build their rows without rendering anything
   (:func:`orchard.data.examples.merge_recorded`), and ``metadata["proxy_records"]`` names the
   session's records;
5. the submission is read from the sandbox by the harness's ``submission`` hook (SWE: the
   repository's diff), and the episode graded as every episode is
   (:func:`~orchard.harness.episode.grade_episode`).

How it ends: exit status 0 is ``submitted`` (graded); the wall clock, or a session that ran past its
deadline, is ``time_limit`` (not graded, reward ``None``); any other exit status is
``policy_error`` (aborted, reward ``None``), with the tail of the harness's output in the metadata.
A graded episode whose calls are not all usable for RL (ids missing, a call cut off) keeps its
``resolved`` for evaluation and gets reward ``None``: training drops it.

The session's records come from the proxy over HTTP, so the proxy may run on another machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard.data.trajectory import EndReason, Message, Trajectory, token_digest
from orchard.env.client import AsyncSandbox, AsyncSandboxClient
from orchard.harness.episode import SetupCache, delete_sandbox, episode_sandbox, failed_episode, grade_episode
from orchard.harness.task import Task
from orchard.rollout.proxy_client import ProxyClient

log = logging.getLogger(__name__)

OUTPUT_TAIL_BYTES = 8192  # of the harness's own output, kept in the trajectory's metadata
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ExternalHarness:
    """How to run one harness (see the module docstring for the placeholders and variables)."""

    name: str
    command: Sequence[str]
    submission: Callable[[AsyncSandbox], Awaitable[str]] | None = None  # None: the harness submits nothing
    env: Mapping[str, str] = field(default_factory=dict)
    wall_clock_s: float = 600.0
    model: str = "orchard"  # the name it calls the model by (the proxy puts the upstream's in its place)
    task_template: str = "{task}"  # what the harness is given as its task; {task} is the task's prompt

    def task_text(self, prompt: str) -> str:
        """The task file's text: the template with the task's prompt in place of ``{task}``."""
        return self.task_template.replace("{task}", prompt)

    def argv(self, values: Mapping[str, str]) -> list[str]:
        """The command with each ``{name}`` of ``values`` filled in (any other brace is left as it is)."""
        argv = []
        for part in self.command:
            for name, value in values.items():
                part = part.replace("{" + name + "}", value)
            argv.append(part)
        return argv


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _message(chat: Mapping[str, Any]) -> Message:
    """A message the harness sent, as an Orchard message (what the policy did not sample)."""
    role = chat.get("role") if chat.get("role") in ROLES else "user"
    return Message(role=role, content=_text(chat.get("content")),
                   tool_call_id=chat.get("tool_call_id") if role == "tool" else None)


def trajectory_from_calls(calls: Sequence[Mapping[str, Any]], *, task_id: str, harness: str,
                          policy: str) -> Trajectory:
    """The conversation a session's calls add up to, each completion an assistant message with its ids.

    A call's messages that extend the previous call's add only what is new; a harness that rewrote
    its history (a summary, a new system prompt for its final answer) gets the call's messages whole
    again, and ``metadata["history_rewritten"]`` counts those calls. Assistant messages the harness
    sends are its copies of earlier replies and are left out: each assistant message of the
    trajectory is one recorded completion, with its ids.
    """
    messages: list[Message] = []
    prompts: list[list[int] | None] = []
    previous: list | None = None
    rewritten = 0
    for call in calls:
        completions = call.get("completions") or []
        if call.get("status") != "ok" or not completions:
            continue
        sent = list((call.get("request") or {}).get("messages") or [])
        if previous is None or sent[:len(previous)] != previous:
            rewritten += previous is not None
            new = sent
        else:
            new = sent[len(previous):]
        messages += [_message(m) for m in new if m.get("role") != "assistant"]  # echoes of earlier replies
        completion = completions[0]
        prompt = (call.get("prompt_token_ids") or [None])[0]
        messages.append(Message(
            role="assistant", content=completion.get("text") or "", token_ids=completion.get("token_ids"),
            logprobs=completion.get("logprobs") if completion.get("token_ids") is not None else None,
            prompt_tokens=len(prompt) if prompt is not None else None,
            prompt_digest=token_digest(prompt) if prompt is not None else None,
            weight_version=call.get("weight_version")))
        prompts.append(prompt)
        previous = sent
    metadata: dict[str, Any] = {"history_rewritten": rewritten} if rewritten else {}
    if prompts and all(p is not None for p in prompts) and all(m.token_ids is not None for m in messages
                                                                  if m.role == "assistant"):
        metadata["recorded_prompt_ids"] = prompts  # what training builds its rows from
    return Trajectory(task_id=task_id, harness=harness, policy=policy, messages=messages, metadata=metadata)


async def _run_process(argv: list[str], env: dict[str, str], log_path: str, wall_clock_s: float) -> int | None:
    """The harness's exit status, or ``None`` when the wall clock ran out (its group is killed then,
    and on cancellation)."""
    with open(log_path, "wb") as out:
        process = await asyncio.create_subprocess_exec(*argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out,
                                                       stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    try:
        return await asyncio.wait_for(process.wait(), wall_clock_s)
    except TimeoutError:
        return None
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


def _tail(path: str) -> str:
    with open(path, "rb") as handle:
        handle.seek(max(os.path.getsize(path) - OUTPUT_TAIL_BYTES, 0))
        return handle.read().decode(errors="replace")


async def run_external_episode(client: AsyncSandboxClient, harness: ExternalHarness, task: Task, proxy: ProxyClient,
                               *, seed: int, sampling: Mapping[str, Any] | None = None, policy: str = "proxied",
                               metadata: Mapping[str, Any] | None = None, setups: SetupCache | None = None
                               ) -> Trajectory:
    """One graded episode of ``task`` run by ``harness`` through ``proxy`` (see the module docstring)."""
    box, ready = await episode_sandbox(client, task, setups)
    timing: dict[str, float] = {}
    try:
        clock = time.monotonic()
        if not ready:
            await task.setup(box)
        timing["setup_s"] = time.monotonic() - clock
        session = await proxy.open(task.id, harness.name, rollout_id=f"{task.id}/{seed}",
                                   deadline_s=harness.wall_clock_s, sampling={**(sampling or {}), "seed": seed})
        with tempfile.TemporaryDirectory(prefix=f"orchard-{harness.name}-") as scratch:
            task_file = os.path.join(scratch, "task.txt")
            with open(task_file, "w") as handle:
                handle.write(harness.task_text(task.prompt))
            values = {"base_url": session["base_url"], "api_key": session["api_key"], "model": harness.model,
                      "orchard_url": client.base_url, "orchard_api_key": client.api_key, "sandbox_id": box.id,
                      "task_file": task_file, "output_dir": scratch}
            env = {**os.environ, **harness.env, "OPENAI_BASE_URL": values["base_url"],
                   "OPENAI_API_BASE": values["base_url"], "OPENAI_API_KEY": values["api_key"],
                   "ORCHARD_URL": values["orchard_url"], "ORCHARD_API_KEY": values["orchard_api_key"],
                   "ORCHARD_SANDBOX_ID": box.id, "ORCHARD_TASK_FILE": task_file, "ORCHARD_OUTPUT_DIR": scratch}
            clock = time.monotonic()
            try:
                status = await _run_process(harness.argv(values), env, os.path.join(scratch, "harness.log"),
                                            harness.wall_clock_s)
            finally:
                await proxy.close(session["id"])
            timing["harness_s"] = time.monotonic() - clock
            output = _tail(os.path.join(scratch, "harness.log"))
        record = await proxy.records(session["id"])
        trajectory = trajectory_from_calls(record.calls, task_id=task.id, harness=harness.name, policy=policy)
        if status is None or record.status == "timed_out":
            reason = EndReason.TIME_LIMIT
        elif status == 0:
            reason = EndReason.SUBMITTED
        else:
            reason = EndReason.POLICY_ERROR
        trajectory.metadata.update({**(metadata or {}), "seed": seed, "end_reason": reason, "harness_exit": status,
                                    "harness_output": output, "proxy_records": session["records"],
                                    "proxy_session": session["id"], "calls": len(record.calls),
                                    "trainable": record.trainable})
        if reason is EndReason.SUBMITTED and harness.submission is not None:
            trajectory.metadata["submission"] = await harness.submission(box)
        clock = time.monotonic()
        outcome, box = await grade_episode(client, task, trajectory, box, setups)
        timing["grade_s"] = time.monotonic() - clock
        if not record.trainable:
            outcome = outcome.model_copy(update={"reward": None})  # evaluation keeps resolved; training drops it
        trajectory.outcome = outcome.model_copy(update={"status": reason.status})
        trajectory.metadata["episode_timing"] = timing
        return trajectory
    finally:
        if box is not None:
            await delete_sandbox(box)


class ExternalRunner:
    """:func:`run_external_episode` for many episodes, at most ``concurrency`` at a time; as
    :class:`~orchard.harness.episode.EpisodeRunner`, ``run_one`` never raises for one episode's failure."""

    def __init__(self, client: AsyncSandboxClient, harness: ExternalHarness, proxy: ProxyClient, *,
                 sampling: Mapping[str, Any] | None = None, policy: str = "proxied", concurrency: int = 4,
                 episode_seconds: float | None = None, setups: SetupCache | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.client, self.harness, self.proxy, self.policy = client, harness, proxy, policy
        self.sampling, self.setups, self.episode_seconds = dict(sampling or {}), setups, episode_seconds
        self.gate = asyncio.Semaphore(concurrency)

    async def run_one(self, task: Task, seed: int, *, metadata: Mapping[str, Any] | None = None,
                      **_: Any) -> Trajectory:
        async with self.gate:
            try:
                async with asyncio.timeout(self.episode_seconds):
                    return await run_external_episode(self.client, self.harness, task, self.proxy, seed=seed,
                                                      sampling=self.sampling, policy=self.policy,
                                                      metadata=metadata, setups=self.setups)
            except Exception as exc:
                log.warning("%s episode %s/%d failed: %s: %s", self.harness.name, task.id, seed,
                            type(exc).__name__, exc)
                return failed_episode(task, self.harness, _Named(self.policy), seed, exc, dict(metadata or {}))


@dataclass(frozen=True)
class _Named:
    name: str


"""Wire schema of Orchard Env, shared by the SDK, the orchestrator and the in-sandbox agent.

Everything that crosses the network is defined here once:

* JSON bodies (pydantic models) for exec, processes, patches and sandbox lifecycle;
* the problem-detail error body and its stable ``code`` values;
* ``HOT_ROUTES``: the agent's endpoints. The orchestrator mounts each of them under
  ``/v1/sandboxes/{id}`` and forwards it to the agent unchanged, so the agent and the
  orchestrator cannot drift apart.

File contents always travel as raw request or response bodies, never as base64 in JSON.
Exec output is JSON because it is small and capped; a stream that is not valid UTF-8 is sent
base64-encoded with ``*_encoding = "base64"`` so that output is binary-safe.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

API_PREFIX = "/v1"
# A directory every sandbox has and its commands can write, whose ``bin`` the agent puts first on ``PATH``: where
# tasks install their tools and shims. It stays writable under a read-only root (the Kubernetes backend's default
# mounts a volume there), and the agent gives it to the user commands run as.
TOOLS_DIR = "/opt/orchard"
TOOLS_BIN = f"{TOOLS_DIR}/bin"
# A port forward (``/v1/sandboxes/{id}/ports/{port}/{path}``) relays these methods to a server on the sandbox's loopback.
PORT_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20  # per stream
MAX_OUTPUT_BYTES_LIMIT = 64 << 20
TOKEN_HEADER = "authorization"
NEXT_OFFSET_HEADER = "x-orchard-next-offset"


class ErrorCode(StrEnum):
    """Stable machine-readable error codes carried in every problem body."""

    UNAUTHORIZED = "unauthorized"
    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    SANDBOX_NOT_FOUND = "sandbox_not_found"
    SANDBOX_NOT_READY = "sandbox_not_ready"
    PATH_NOT_FOUND = "path_not_found"
    PATH_OUTSIDE_SANDBOX = "path_outside_sandbox"
    IS_A_DIRECTORY = "is_a_directory"
    NOT_A_DIRECTORY = "not_a_directory"
    PERMISSION_DENIED = "permission_denied"
    NO_SPACE = "no_space"
    PROCESS_NOT_FOUND = "process_not_found"
    AGENT_UNAVAILABLE = "agent_unavailable"
    PORT_UNREACHABLE = "port_unreachable"
    BACKEND_ERROR = "backend_error"
    ISOLATION_UNAVAILABLE = "isolation_unavailable"
    IMAGE_NOT_FOUND = "image_not_found"
    IMAGE_INVALID = "image_invalid"
    SNAPSHOT_NOT_FOUND = "snapshot_not_found"
    UNSUPPORTED = "unsupported"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INTERNAL = "internal"


class Problem(BaseModel):
    """RFC 9457 problem details, plus a stable ``code``."""

    type: str = "about:blank"
    title: str
    status: int
    code: ErrorCode
    detail: str = ""


# --------------------------------------------------------------------------- exec

def _check_env(env: dict[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"invalid environment variable {key!r}")
    return env


Text = Annotated[str, Field(max_length=1 << 20)]
EnvMap = Annotated[dict[str, str], Field(max_length=1024), AfterValidator(_check_env)]


class CommandSpec(BaseModel):
    """A command: a shell string (run by ``/bin/sh -c``) or an argv list (run directly)."""

    model_config = ConfigDict(extra="forbid")

    command: str | Annotated[list[Text], Field(min_length=1, max_length=4096)]
    cwd: str | None = Field(None, description="Working directory; defaults to the sandbox workdir.")
    env: EnvMap = Field(default_factory=dict)

    @field_validator("command")
    @classmethod
    def _no_nul(cls, command: str | list[str]) -> str | list[str]:
        parts = [command] if isinstance(command, str) else command
        if any("\0" in part for part in parts):
            raise ValueError("command must not contain NUL bytes")
        if isinstance(command, str) and not command.strip():
            raise ValueError("command must not be empty")
        if len(command) > (1 << 20):
            raise ValueError("command is longer than 1 MiB")
        return command

    @field_validator("cwd")
    @classmethod
    def _cwd_ok(cls, cwd: str | None) -> str | None:
        if cwd is not None and (not cwd or "\0" in cwd):
            raise ValueError("cwd must be a non-empty path without NUL bytes")
        return cwd


class ExecRequest(CommandSpec):
    stdin: Text | None = Field(None, description="Bytes fed to stdin, encoded as stdin_encoding.")
    stdin_encoding: Literal["utf-8", "base64"] = "utf-8"
    timeout: float = Field(60.0, gt=0, le=86_400, description="Seconds before the process group is killed.")
    max_output_bytes: int = Field(
        DEFAULT_MAX_OUTPUT_BYTES, ge=0, le=MAX_OUTPUT_BYTES_LIMIT, description="Cap per stream."
    )

    def stdin_bytes(self) -> bytes | None:
        if self.stdin is None:
            return None
        return base64.b64decode(self.stdin) if self.stdin_encoding == "base64" else self.stdin.encode()


class ExecResponse(BaseModel):
    exit_code: int | None = Field(description="Exit status; -N when killed by signal N.")
    stdout: str
    stderr: str
    stdout_encoding: Literal["utf-8", "base64"] = "utf-8"
    stderr_encoding: Literal["utf-8", "base64"] = "utf-8"
    stdout_total: int = Field(description="Bytes the command wrote to stdout, kept or not.")
    stderr_total: int
    timed_out: bool
    truncated: bool
    duration: float


def encode_output(data: bytes) -> tuple[str, Literal["utf-8", "base64"]]:
    """Encode bytes for JSON: UTF-8 text when valid, base64 otherwise."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def decode_output(text: str, encoding: str) -> bytes:
    return base64.b64decode(text) if encoding == "base64" else text.encode("utf-8")


class StreamEvent(BaseModel):
    """One NDJSON line of a streaming exec: output chunks, then a final ``exit`` event."""

    type: Literal["stdout", "stderr", "exit"]
    data: str = ""
    encoding: Literal["utf-8", "base64"] = "utf-8"
    exit_code: int | None = None
    timed_out: bool = False
    duration: float = 0.0


# --------------------------------------------------------------------- processes


class ProcessStartRequest(CommandSpec):
    name: str | None = Field(None, max_length=128)


class ProcessInfo(BaseModel):
    id: str
    name: str | None
    pid: int
    running: bool
    exit_code: int | None
    started_at: float
    ended_at: float | None
    log_bytes: int


# ------------------------------------------------------------------------- files


class FileInfo(BaseModel):
    path: str
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    target: str | None = None


class PatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    diff: Text = Field(min_length=1, description="A unified diff (git or plain).")
    cwd: str | None = Field(None, description="Directory the diff's paths are relative to.")
    fuzz: int = Field(2, ge=0, le=3, description="Fuzz factor for the `patch` fallback.")


class RejectedHunk(BaseModel):
    file: str
    header: str
    text: str


class PatchResponse(BaseModel):
    applied: bool
    method: Literal["git", "patch"] | None
    files: list[str]
    rejected: list[RejectedHunk]
    output: str


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str
    pid: int
    uptime: float


# --------------------------------------------------------------------- lifecycle

_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(|k|Ki|M|Mi|G|Gi|T|Ti)\s*$")
_MEMORY_UNITS = {"": 1, "k": 10**3, "Ki": 2**10, "M": 10**6, "Mi": 2**20, "G": 10**9, "Gi": 2**30,
                 "T": 10**12, "Ti": 2**40}


def parse_memory(text: str) -> int:
    """Parse a Kubernetes-style quantity (``512Mi``, ``2G``, ``1073741824``) into bytes."""
    match = _MEMORY_RE.match(text)
    if not match:
        raise ValueError(f"invalid memory quantity {text!r}; use e.g. '512Mi' or '2Gi'")
    return int(float(match.group(1)) * _MEMORY_UNITS[match.group(2)])


class SandboxSpec(BaseModel):
    """What a client asks for. Backends map it onto namespaces, cgroups or pods."""

    model_config = ConfigDict(extra="forbid")

    cpu: float = Field(1.0, ge=0.1, le=256, description="Cores; at least 0.1, so the agent starts in seconds "
                                                         "(a 5e-324 core quota, found by fuzzing, never did).")
    memory: str = Field("1Gi", description="Kubernetes-style quantity, between 16Mi and 1Ti.")
    pids: int = Field(1024, ge=16, le=1 << 20, description="Maximum number of tasks.")
    disk: str | None = Field(None, description="Quota on what the sandbox writes, Kubernetes-style, between 1Mi "
                                               "and 1Ti; none: the host's free space. Local backend: a tmpfs.")
    ttl: float = Field(600.0, gt=0, le=7 * 86_400, description="Seconds without heartbeat before reaping.")
    network: Literal["none", "host"] = Field(
        "none", description="'none': no way out (but to the `egress` destinations, on Kubernetes); 'host': any "
                            "destination (locally the host's network; on Kubernetes all but the metadata server).")
    egress: Annotated[list[str], Field(max_length=64)] = Field(
        default_factory=list, description="CIDRs a sandbox with network='none' may reach (Kubernetes backend; "
                                          "the cloud metadata server stays blocked).")
    dns: bool = Field(False, description="Allow DNS lookups through the cluster's DNS (Kubernetes backend).")
    isolation: Literal["namespaces", "none"] = Field(
        "namespaces", description="'none' runs commands directly on the host: unsafe, for debugging only."
    )
    image: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$",
                              description="Local backend: an image the orchestrator offers (a `docker save` tarball "
                                          "or an OCI layout, by file name); none: the host's tree, read-only. "
                                          "Kubernetes backend: a short name the orchestrator maps, or an image "
                                          "reference (registry/repository:tag or @sha256:digest).")
    from_snapshot: str | None = Field(None, pattern=r"^[a-f0-9]{32}$",
                                      description="Start from a snapshot's files (its image, workdir and env "
                                                  "too, unless given here).")
    workdir: str | None = Field(None, pattern=r"^/[^\x00]*$",
                                description="Default cwd of commands; default: the image's WORKDIR, else /workspace.")
    env: EnvMap = Field(default_factory=dict)
    labels: Annotated[dict[str, str], Field(max_length=64)] = Field(default_factory=dict)

    @field_validator("memory")
    @classmethod
    def _memory_ok(cls, memory: str) -> str:
        size = parse_memory(memory)
        if not (16 << 20) <= size <= (1 << 40):
            raise ValueError("memory must be between 16Mi and 1Ti")
        return memory

    @field_validator("image")
    @classmethod
    def _image_ok(cls, image: str | None) -> str | None:
        if image is not None and any(part in ("", ".", "..") for part in image.split("/")):
            raise ValueError("an image name has no empty, '.' or '..' path segments")
        return image

    @field_validator("egress")
    @classmethod
    def _egress_ok(cls, egress: list[str]) -> list[str]:
        return [str(ipaddress.ip_network(cidr, strict=False)) for cidr in egress]

    @field_validator("disk")
    @classmethod
    def _disk_ok(cls, disk: str | None) -> str | None:
        if disk is not None and not (1 << 20) <= parse_memory(disk) <= (1 << 40):
            raise ValueError("disk must be between 1Mi and 1Ti")
        return disk

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory)

    @property
    def disk_bytes(self) -> int | None:
        return parse_memory(self.disk) if self.disk else None


# A sandbox that fails to start is deleted, and the create (or wait) call answers with the reason.
SandboxStatus = Literal["creating", "ready"]


class SandboxInfo(BaseModel):
    id: str
    status: SandboxStatus
    spec: SandboxSpec
    created_at: float
    expires_at: float
    backend: str


class SnapshotInfo(BaseModel):
    """A sandbox's files at one moment, that new sandboxes start from (``SandboxSpec.from_snapshot``)."""

    id: str
    source: str  # the sandbox it was taken from
    created_at: float
    size_bytes: int
    image: str | None = None


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo]


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(..., ge=1, le=256, description="How many independent copies.")
    ttl: float | None = Field(None, gt=0, le=7 * 86_400, description="Their TTL; default: the source's.")


class PoolRequest(BaseModel):
    """A warm pool: ``size`` sandboxes of ``spec`` kept ready, so a matching create is a claim."""

    model_config = ConfigDict(extra="forbid")

    spec: SandboxSpec
    size: int = Field(..., ge=0, le=1024, description="Ready sandboxes to keep; 0 removes the pool.")


class PoolInfo(BaseModel):
    key: str  # what a create must match: its spec, less ttl and labels
    spec: SandboxSpec
    size: int
    ready: int
    creating: int
    claims: int  # creates served from the pool
    misses: int  # matching creates that found it empty
    last_error: str = ""


class PoolList(BaseModel):
    pools: list[PoolInfo]


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo]


# ------------------------------------------------------------------- hot routes


@dataclass(frozen=True)
class HotRoute:
    """One agent endpoint. The orchestrator mounts it at ``/v1/sandboxes/{id}<path>``.

    ``body`` is the JSON request model, or ``"raw"`` for a streamed byte body; ``response`` is
    the JSON response model, or ``"raw"``/``"ndjson"`` for a streamed body.
    """

    name: str
    method: str
    path: str
    summary: str
    body: type[BaseModel] | Literal["raw"] | None = None
    response: Any = None  # a model, list[model], "raw", "ndjson" or None
    query: tuple[tuple[str, str, bool], ...] = ()  # (name, json type, required)


_PATH_Q = (("path", "string", True),)

HOT_ROUTES: tuple[HotRoute, ...] = (
    HotRoute("exec", "POST", "/exec", "Run a command to completion.", ExecRequest, ExecResponse),
    HotRoute("exec_stream", "POST", "/exec/stream", "Run a command, streaming NDJSON StreamEvents.",
             ExecRequest, "ndjson"),
    HotRoute("process_start", "POST", "/processes", "Start a background process.", ProcessStartRequest,
             ProcessInfo),
    HotRoute("process_list", "GET", "/processes", "List background processes.", None, list[ProcessInfo]),
    HotRoute("process_get", "GET", "/processes/{process_id}", "Status of a background process.", None,
             ProcessInfo),
    HotRoute("process_logs", "GET", "/processes/{process_id}/logs",
             "Combined stdout/stderr of a process, from a byte offset.", None, "raw",
             (("offset", "integer", False), ("limit", "integer", False))),
    HotRoute("process_kill", "DELETE", "/processes/{process_id}", "Signal a process group.", None,
             ProcessInfo, (("signal", "integer", False),)),
    HotRoute("file_write", "PUT", "/files", "Write a file from the raw request body.", "raw", FileInfo,
             (*_PATH_Q, ("mode", "integer", False))),
    HotRoute("file_read", "GET", "/files", "Read a file as a raw byte stream.", None, "raw", _PATH_Q),
    HotRoute("file_delete", "DELETE", "/files", "Delete a file or directory tree.", None, None, _PATH_Q),
    HotRoute("file_list", "GET", "/files/list", "List a directory.", None, list[FileInfo], _PATH_Q),
    HotRoute("file_stat", "GET", "/files/stat", "Stat a path (symlinks are not followed).", None, FileInfo,
             _PATH_Q),
    HotRoute("archive_write", "PUT", "/archive", "Extract a tar (optionally gzip) body into a directory.",
             "raw", FileInfo, _PATH_Q),
    HotRoute("archive_read", "GET", "/archive", "Download a directory as a tar stream.", None, "raw",
             _PATH_Q),
    HotRoute("patch", "POST", "/patch", "Apply a unified diff (git apply, then patch with fuzz).",
             PatchRequest, PatchResponse),
)

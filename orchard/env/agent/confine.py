"""What a sandbox's processes can never undo: no new privileges, and a seccomp filter.

:func:`confine` is called once in a sandbox's PID 1, after its root is built and before the agent
(or an image's ``setpriv``) runs; every process in the sandbox descends from it and inherits both:

* **no_new_privs**: no exec gains privileges again (set-uid binaries, file capabilities);
* **a seccomp filter** modelled on Docker's default profile, as a deny list over an allow-all
  default: the calls Docker refuses a container without ``CAP_SYS_ADMIN`` and friends get
  ``EPERM`` (:data:`DENIED`): mounting and namespaces (``mount``, ``unshare``, ``setns``, new
  namespaces through ``clone``; ``clone3`` gets ``ENOSYS`` so that libc falls back to ``clone``,
  whose flags a filter can read), the kernel keyring, ``bpf``, ``perf_event_open``, kernel
  modules, ``kexec``, ``reboot``, swap, the clocks, ``ptrace``-like reads of other processes'
  memory, ``userfaultfd``, ``io_uring`` and the new mount API. Calls of a foreign architecture
  (32-bit ``int 0x80`` from a 64-bit process) kill the caller, libseccomp's default.

Where it departs from Docker's profile: Docker allow-lists about 350 calls and refuses the rest;
this denies a list and allows the rest, so a call added to a later kernel is allowed until it is
listed here. ``ptrace`` stays allowed (debuggers and ``strace`` work on the sandbox's own
processes; the PID namespace keeps every other process out of reach), and so do the NUMA calls
(``mbind``, ``set_mempolicy``), which numerical libraries use.

The filter is built with libseccomp (Debian's ``libseccomp2``, which ``apt`` itself depends on)
through ``pyseccomp``.
"""

from __future__ import annotations

import ctypes
import errno

PR_SET_NO_NEW_PRIVS = 38
CLONE_NAMESPACES = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                    "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080}
DENIED = (
    # file systems and namespaces
    "mount", "umount", "umount2", "pivot_root", "unshare", "setns", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "open_by_handle_at", "name_to_handle_at", "quotactl", "quotactl_fd",
    # the kernel: keyring, BPF, tracing, modules, kexec, reboot, swap, clocks, accounting, logs
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "init_module", "finit_module", "delete_module",
    "create_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "settimeofday",
    "clock_settime", "clock_adjtime", "acct", "syslog", "vhangup", "iopl", "ioperm", "lookup_dcookie",
    "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl",
    # other processes' memory, page-fault handling, io_uring
    "process_vm_readv", "process_vm_writev", "kcmp", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register",
)


class ConfinementError(RuntimeError):
    """The filter could not be built or loaded (no libseccomp on this host, or the kernel refused)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def no_new_privs() -> None:
    """Set ``no_new_privs`` on this process (inherited by every child, never cleared)."""
    if _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise ConfinementError(f"prctl(PR_SET_NO_NEW_PRIVS): {errno.errorcode.get(error, error)}")


def build_filter():  # -> pyseccomp.SyscallFilter
    """The filter of the module docstring, not loaded."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # pyseccomp missing, or it found no libseccomp.so.2
        raise ConfinementError(f"the seccomp filter needs libseccomp2 and pyseccomp: {exc}") from None
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED:
        try:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (OSError, ValueError):  # a call this architecture does not have (create_module, _sysctl...)
            continue
    for flag in CLONE_NAMESPACES.values():
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    return rules


def confine(rules=None) -> None:
    """Set no_new_privs and load the filter (``rules``, default: :func:`build_filter`) on this
    process. The zygote builds the filter once and loads it in every sandbox it forks."""
    rules = rules if rules is not None else build_filter()
    no_new_privs()
    try:
        rules.load()
    except OSError as exc:
        raise ConfinementError(f"the kernel refused the seccomp filter: {exc}") from None

"""What a sandbox's processes can never undo: no new privileges, and a seccomp filter.

:func:`confine` is called once in a sandbox's PID 1, after its root is built and before the agent
(or an image's ``setpriv``) runs; every process in the sandbox descends from it and inherits both:

* **no_new_privs**: no exec gains privileges again (set-uid binaries, file capabilities);
* **a seccomp filter** that is an allow list, as Docker's default profile is: the calls a normal
  workload makes (:data:`ALLOWED`: files, memory, processes and threads, signals, time, sockets,
  IPC, polling; the list Docker keeps is the reference) run, and every other call fails.
  Calls a container runtime refuses a container without ``CAP_SYS_ADMIN`` and friends
  (:data:`REFUSED`: mounting and namespaces, the kernel keyring, ``bpf``, ``perf_event_open``,
  kernel modules, ``kexec``, ``reboot``, swap, the clocks, reading other processes' memory,
  ``userfaultfd``, ``io_uring``, the new mount API) fail with ``EPERM``; so do ``clone`` with a
  namespace flag and sockets of the ``AF_VSOCK`` family (the way to a hypervisor's host).
  Everything else, a call added to a later kernel included, fails with ``ENOSYS``, as on a kernel
  that lacks it, so that libc and runtimes take the fallback they keep for older kernels
  (``clone3`` is refused this way on purpose: libc then uses ``clone``, whose flags a filter can
  read). Calls of a foreign architecture (32-bit ``int 0x80`` from a 64-bit process) kill the
  caller, libseccomp's default.

Where it departs from Docker's profile: ``ENOSYS`` rather than ``EPERM`` for unlisted calls (Docker's
``EPERM`` for ``faccessat2`` once broke libc's fallback in new images on old profiles);
``io_uring`` stays refused; ``ptrace`` stays allowed (debuggers and ``strace`` work on the sandbox's
own processes; the PID namespace keeps every other process out of reach) but ``process_vm_readv`` /
``process_vm_writev``, ``kcmp`` and ``pidfd_getfd`` do not; ``chroot`` is allowed (the sandbox keeps
``CAP_SYS_CHROOT``), ``modify_ldt`` is not; the NUMA policy calls that numerical libraries make
(``mbind``, ``set_mempolicy``, ``get_mempolicy``) are allowed without ``CAP_SYS_NICE``. A name this
machine's libseccomp does not know (a call newer than it, or one of another architecture) is
left out of the filter, so it gets ``ENOSYS``.

The filter is built with libseccomp (Debian's ``libseccomp2``, which ``apt`` itself depends on)
through ``pyseccomp``, as a binary tree of system call numbers (libseccomp's optimisation level 2)
so that a call's cost does not grow with its place in the list. ``build_filter(allow_unlisted=True)``
builds the deny list Orchard used before (allow every call but :data:`REFUSED`), kept only as the
benchmarks' peer (``benchmarks/confinement.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno

PR_SET_NO_NEW_PRIVS = 38
AF_VSOCK = 40
CLONE_NAMESPACES = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                    "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080}
# personality(2) values a program may set or query: Linux, 32-bit Linux, a 2.6 uname, both, and a query.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

ALLOWED = (
    # files and directories: open, read, write, metadata, links, extended attributes, locks, sync
    "open", "openat", "openat2", "creat", "close", "close_range", "read", "readv", "pread64", "preadv", "preadv2",
    "write", "writev", "pwrite64", "pwritev", "pwritev2", "lseek", "_llseek", "sendfile", "sendfile64",
    "copy_file_range", "splice", "tee", "vmsplice", "readahead", "fadvise64", "fadvise64_64", "fallocate",
    "truncate", "truncate64", "ftruncate", "ftruncate64", "fsync", "fdatasync", "sync", "syncfs",
    "sync_file_range", "flock", "fcntl", "fcntl64", "ioctl", "dup", "dup2", "dup3",
    "stat", "stat64", "lstat", "lstat64", "fstat", "fstat64", "newfstatat", "fstatat64", "statx", "statfs",
    "statfs64", "fstatfs", "fstatfs64", "access", "faccessat", "faccessat2", "readlink", "readlinkat",
    "getdents", "getdents64", "getcwd", "chdir", "fchdir", "chroot", "mkdir", "mkdirat", "rmdir", "mknod", "mknodat",
    "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat", "unlink", "unlinkat",
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "chown32", "fchown", "fchown32", "fchownat", "lchown",
    "lchown32", "umask", "utime", "utimes", "utimensat", "utimensat_time64", "futimesat",
    "getxattr", "lgetxattr", "fgetxattr", "setxattr", "lsetxattr", "fsetxattr", "listxattr", "llistxattr",
    "flistxattr", "removexattr", "lremovexattr", "fremovexattr", "inotify_init", "inotify_init1",
    "inotify_add_watch", "inotify_rm_watch", "fanotify_mark", "memfd_create", "memfd_secret",
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents", "io_pgetevents_time64",
    "ioprio_get", "ioprio_set", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
    # memory
    "brk", "mmap", "mmap2", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync", "remap_file_pages",
    "mlock", "mlock2", "mlockall", "munlock", "munlockall", "membarrier", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "mbind", "get_mempolicy", "set_mempolicy", "set_mempolicy_home_node", "cachestat",
    "map_shadow_stack", "mseal", "process_mrelease",
    # processes and threads (clone is allowed below when it asks for no new namespace)
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "waitpid", "kill", "tkill",
    "tgkill", "pidfd_open", "pidfd_send_signal", "ptrace", "getpid", "getppid", "gettid", "getpgid", "setpgid",
    "getpgrp", "getsid", "setsid", "getuid", "getuid32", "geteuid", "geteuid32", "getgid", "getgid32", "getegid",
    "getegid32", "getresuid", "getresuid32", "getresgid", "getresgid32", "getgroups", "getgroups32", "setuid",
    "setuid32", "setgid", "setgid32", "setreuid", "setreuid32", "setregid", "setregid32", "setresuid",
    "setresuid32", "setresgid", "setresgid32", "setgroups", "setgroups32", "setfsuid", "setfsuid32", "setfsgid",
    "setfsgid32", "capget", "capset", "prctl", "arch_prctl", "seccomp", "set_tid_address", "set_robust_list",
    "get_robust_list", "rseq", "set_thread_area", "get_thread_area", "futex", "futex_time64", "futex_waitv",
    "futex_wake", "futex_wait", "futex_requeue", "getrlimit", "ugetrlimit", "setrlimit", "prlimit64", "getrusage",
    "getpriority", "setpriority", "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getattr",
    "sched_setattr", "sched_getparam", "sched_setparam", "sched_getscheduler", "sched_setscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval", "sched_rr_get_interval_time64",
    "getcpu", "uname", "sysinfo", "times", "restart_syscall",
    # signals
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_sigtimedwait_time64", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "sigprocmask", "sigreturn",
    "signalfd", "signalfd4", "pause", "alarm",
    # time (reading it, sleeping, timers; never setting the clock)
    "time", "gettimeofday", "clock_gettime", "clock_gettime64", "clock_getres", "clock_getres_time64",
    "clock_nanosleep", "clock_nanosleep_time64", "nanosleep", "getitimer", "setitimer", "timer_create",
    "timer_delete", "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64", "timer_getoverrun",
    "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "adjtimex",
    # sockets (socket itself below, without AF_VSOCK) and polling
    "socketpair", "bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername", "getsockopt",
    "setsockopt", "shutdown", "send", "sendto", "sendmsg", "sendmmsg", "recv", "recvfrom", "recvmsg", "recvmmsg",
    "recvmmsg_time64", "socketcall", "pipe", "pipe2", "eventfd", "eventfd2", "select", "_newselect", "pselect6",
    "pselect6_time64", "poll", "ppoll", "ppoll_time64", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_ctl_old", "epoll_wait", "epoll_wait_old", "epoll_pwait", "epoll_pwait2",
    # System V and POSIX IPC (private to the sandbox's IPC namespace)
    "ipc", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semtimedop_time64", "semctl",
    "shmget", "shmat", "shmdt", "shmctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedsend_time64",
    "mq_timedreceive", "mq_timedreceive_time64", "mq_notify", "mq_getsetattr", "getrandom",
)
REFUSED = (
    # file systems and namespaces
    "mount", "umount", "umount2", "pivot_root", "unshare", "setns", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "open_by_handle_at", "name_to_handle_at", "quotactl", "quotactl_fd",
    "sethostname", "setdomainname", "fanotify_init",
    # the kernel: keyring, BPF, tracing, modules, kexec, reboot, swap, clocks, accounting, logs
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "init_module", "finit_module", "delete_module",
    "create_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "settimeofday", "stime",
    "clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64", "acct", "syslog", "vhangup", "iopl",
    "ioperm", "lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl",
    # other processes' memory and files, page-fault handling, io_uring
    "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd", "kcmp", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
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


def _add(rules, action, name: str, *args) -> None:
    """One rule; a name this libseccomp does not know on this architecture is left out (it gets the default)."""
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        rules.add_rule(action, name, *args)


def build_filter(allow_unlisted: bool = False):  # -> pyseccomp.SyscallFilter
    """The filter of the module docstring, not loaded (``allow_unlisted``: the old deny list, a benchmark peer)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # pyseccomp missing, or it found no libseccomp.so.2
        raise ConfinementError(f"the seccomp filter needs libseccomp2 and pyseccomp: {exc}") from None
    rules = seccomp.SyscallFilter(seccomp.ALLOW if allow_unlisted else seccomp.ERRNO(errno.ENOSYS))
    # A binary tree over call numbers; an older libseccomp builds a linear filter of the same rules.
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        rules.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)
    refuse = seccomp.ERRNO(errno.EPERM)
    for name in REFUSED:
        _add(rules, refuse, name)
    any_namespace = 0
    for flag in CLONE_NAMESPACES.values():
        _add(rules, refuse, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        any_namespace |= flag
    _add(rules, seccomp.ERRNO(errno.ENOSYS), "clone3")
    _add(rules, refuse, "socket", seccomp.Arg(0, seccomp.EQ, AF_VSOCK))
    if allow_unlisted:
        return rules
    for name in ALLOWED:
        _add(rules, seccomp.ALLOW, name)
    _add(rules, seccomp.ALLOW, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, any_namespace, 0))
    _add(rules, seccomp.ALLOW, "socket", seccomp.Arg(0, seccomp.NE, AF_VSOCK))
    for value in PERSONALITIES:
        _add(rules, seccomp.ALLOW, "personality", seccomp.Arg(0, seccomp.EQ, value))
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

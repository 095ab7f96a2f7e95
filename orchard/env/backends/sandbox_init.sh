#!/bin/sh
# Orchard local sandbox init: PID 1 of fresh pid/mount/uts/ipc(/net) namespaces, on the rootless
# path (a backend running as root builds the same root with system calls: rootfs.py, zygote.py).
#
# Builds the sandbox's private root and execs the agent in it:
#   /                 overlay: the host's / read-only below, a private writable layer above
#                     (rootless fallback: read-only binds of the host's top-level directories)
#   hidden paths      replaced by empty private directories (every top-level entry but the system's,
#                     a few inside those, the state dir)
#   /etc              an allow-listed copy of the host's (ORCHARD_ETC), bound read-only
#   runtime paths     the agent's Python and package, bound read-only at their host paths, with the
#                     package's non-agent parts hidden again (ORCHARD_MASK)
#   /proc /dev /sys   fresh proc for the new pid namespace, a minimal /dev, read-only sysfs
#   /run/orchard      the agent's socket, token and state, shared with the orchestrator
# then pivot_root into it, so nothing of the host tree stays reachable, and drop capabilities.
#
# Arguments come as environment variables (ORCHARD_*), which are cleared before the agent starts.
set -eu

SB="$ORCHARD_SANDBOX_DIR"
R="$SB/merged"

mount --make-rprivate /
if ! mount -t overlay overlay -o "lowerdir=/,upperdir=$SB/rw/upper,workdir=$SB/rw/work" "$R" 2>/dev/null; then
  # Rootless (a user namespace), where the kernel refuses an overlay of the host's /: build the
  # root from read-only bind mounts of the host's top-level directories on a small tmpfs instead.
  # The host tree is then read-only; /workspace, /tmp, /root and the other hidden paths stay writable.
  mount -t tmpfs -o mode=755,size=16m tmpfs "$R"
  for entry in /* /.[!.]*; do
    [ -e "$entry" ] || [ -L "$entry" ] || continue
    name="${entry#/}"
    case "$name" in proc|sys|dev|lost+found) mkdir -p "$R/$name"; continue ;; esac
    if [ -L "$entry" ]; then
      ln -s "$(readlink "$entry")" "$R/$name"
    else
      if [ -d "$entry" ]; then mkdir -p "$R/$name"; else touch "$R/$name"; fi
      mount --rbind "$entry" "$R/$name"
      mount -o remount,bind,ro "$R/$name" 2>/dev/null || true
    fi
  done
  mkdir -p "$SB/rw/upper$ORCHARD_WORKDIR" "$R$ORCHARD_WORKDIR"
  mount --bind "$SB/rw/upper$ORCHARD_WORKDIR" "$R$ORCHARD_WORKDIR"
fi

n=0
for path in $ORCHARD_HIDE; do
  n=$((n + 1))
  if [ -d "$R$path" ] && [ ! -L "$R$path" ]; then
    mkdir -p "$SB/rw/private/$n"
    mount --bind "$SB/rw/private/$n" "$R$path"
  elif [ -f "$R$path" ] && [ ! -L "$R$path" ]; then
    touch "$SB/rw/private/$n"
    mount --bind "$SB/rw/private/$n" "$R$path"
  fi
done
chmod 1777 "$R/tmp" "$R/var/tmp" 2>/dev/null || true

for path in $ORCHARD_RUNTIME; do
  mkdir -p "$R$path"
  mount --bind "$path" "$R$path"
  mount -o remount,bind,ro "$R$path"
done
n=0
for path in $ORCHARD_MASK; do  # the package's parts the agent does not run
  n=$((n + 1))
  if [ -d "$R$path" ]; then
    mkdir -p "$SB/rw/private/mask-$n"
    mount --bind "$SB/rw/private/mask-$n" "$R$path"
  fi
done

if [ -n "${ORCHARD_ETC:-}" ]; then  # the allow-listed /etc (backends/etc.py), never the host's
  mount --rbind "$ORCHARD_ETC" "$R/etc"
  mount -o remount,bind,ro "$R/etc" 2>/dev/null || true
fi

mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t tmpfs -o mode=755,size=1m,nosuid tmpfs "$R/dev"
for dev in null zero full random urandom tty; do
  touch "$R/dev/$dev"
  mount --bind "/dev/$dev" "$R/dev/$dev"
done
mkdir -p "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts" 2>/dev/null || true
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
ln -s pts/ptmx "$R/dev/ptmx"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys" 2>/dev/null ||
  { mount --rbind /sys "$R/sys" && mount -o remount,bind,ro "$R/sys"; } 2>/dev/null || true

mkdir -p "$R$ORCHARD_WORKDIR" "$R/run/orchard"
mount --bind "$SB/run" "$R/run/orchard"

hostname "$ORCHARD_HOSTNAME" 2>/dev/null || true
ip link set lo up 2>/dev/null || true

cd "$R"
mkdir -p .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
cd /

# Drop every capability a container runtime would not give (mount, mknod, module loading, raw I/O,
# ptrace, ...) from the bounding set, and set no_new_privs: nothing the agent starts can ever regain
# them. With --confine the agent loads the seccomp filter on itself before it serves.
exec setpriv --no-new-privs --bounding-set "-all,$ORCHARD_CAPS" env -i PATH="$ORCHARD_PATH" HOME=/root LANG=C.UTF-8 \
  HOSTNAME="$ORCHARD_HOSTNAME" "$ORCHARD_PYTHON" -m orchard.env.agent --uds /run/orchard/agent.sock \
  --token-file /run/orchard/token --env-file /run/orchard/env.json --state-dir /run/orchard/state \
  --workdir "$ORCHARD_WORKDIR" $ORCHARD_CONFINE

#!/usr/bin/env bash
# The Orin image's CPU fallback on aarch64, end to end on an x86-64 machine (see docs/images.md):
#
#   make arm64-check          # = nice tools/arm64-check.sh [--only cpu-arm64,orin,a100] [--work DIR]
#
# Needs root, Docker (dockerd), and network to a Debian mirror (first run) and to PyPI. Not part of the
# default CI: ~30 min on 2 cores the first time (the arm64 root filesystem is cached afterwards).
#  1. QEMU user emulation: qemu-user-static + binfmt-support installed, binfmt_misc mounted, qemu-aarch64
#     enabled (flag F: the interpreter is loaded at registration, so it works inside containers)
#  2. stand-in root filesystems, cached in ${VEO_EDGE_CACHE:-~/.cache/veo-edge}: Debian bookworm
#     (minbase + python3, python3-venv) for arm64 (debootstrap --arch=arm64) and for amd64
#  3. tools/arm64_check.py: its own dockerd, the stand-in bases, the images, the runs, the checks, a summary
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${VEO_EDGE_CACHE:-$HOME/.cache/veo-edge}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PY="${PYTHON:-$here/.venv/bin/python}"
t0=$(date +%s)
step() { echo "== $* (at $(( $(date +%s) - t0 )) s)"; }

[[ $(id -u) -eq 0 ]] || { echo "error: run as root (binfmt_misc, debootstrap, dockerd)" >&2; exit 2; }

step "QEMU user emulation"
need=()
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v update-binfmts >/dev/null || need+=(binfmt-support)
command -v debootstrap >/dev/null || need+=(debootstrap)
if (( ${#need[@]} )); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
reg=/proc/sys/fs/binfmt_misc/qemu-aarch64
# what this run turns on, it turns off again at exit (VEO_EDGE_KEEP_BINFMT=1 leaves it on): a check is
# not a reason to leave every arm64 binary on this machine running under QEMU from then on
mounted_here=0 enabled_here=0
if [[ ! -e /proc/sys/fs/binfmt_misc/status ]]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  mounted_here=1
fi
grep -qs '^enabled' "$reg" || enabled_here=1
restore_binfmt() {
  [[ ${VEO_EDGE_KEEP_BINFMT:-0} == 1 ]] && return
  if (( enabled_here )); then
    update-binfmts --disable qemu-aarch64 >/dev/null 2>&1 || true
    echo "qemu-aarch64: disabled again (VEO_EDGE_KEEP_BINFMT=1 keeps it)"
  fi
  if (( mounted_here )); then umount /proc/sys/fs/binfmt_misc 2>/dev/null || true; fi
}
trap restore_binfmt EXIT
update-binfmts --enable qemu-aarch64 2>/dev/null || true
if [[ ! -e $reg ]] || ! grep -q '^enabled' "$reg" || ! grep -q '^flags:.*F' "$reg"; then
  echo "error: qemu-aarch64 is not registered with binfmt_misc with flag F ($reg): containers cannot run arm64" >&2
  exit 1
fi
echo "qemu-aarch64: $(grep -E '^(interpreter|flags)' "$reg" | tr '\n' ' ')"

rootfs() { # arch tarball
  local arch=$1 tar=$2
  if [[ -s $tar ]]; then echo "cached: $tar"; return; fi
  mkdir -p "$CACHE"
  local work; work="$(mktemp -d "$CACHE/.rootfs-XXXXXX")"
  echo "debootstrap --arch=$arch bookworm (minbase + python3, python3-venv) ..."
  if ! debootstrap --arch="$arch" --variant=minbase --include=python3,python3-venv bookworm \
      "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log" >&2; rm -rf "$work"; echo "error: debootstrap failed" >&2; exit 1
  fi
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  "$here/packaging/base/slim-rootfs.sh" "$work/rootfs"
  tar -C "$work/rootfs" -cf "$work/base.tar" .
  mv "$work/base.tar" "$tar"   # atomic: a killed run leaves no half tarball under the final name
  rm -rf "$work"
}
step "stand-in root filesystems"
rootfs arm64 "$CACHE/base-bookworm-python3-slim-arm64.tar"
rootfs amd64 "$CACHE/base-bookworm-python3-slim.tar"   # the same tarball packaging/base/make-base-image.sh caches

step "images, runs and checks (tools/arm64_check.py)"
cd "$here"
"$PY" tools/arm64_check.py "$@"

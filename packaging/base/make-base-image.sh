#!/usr/bin/env bash
# A local base image for veo-edge's cpu image where no registry can be reached: Debian bookworm
# (minbase) with python3 and python3-venv, made by debootstrap, slimmed as Debian's -slim images are
# (slim-rootfs.sh) and imported into a Docker engine.
#
#   packaging/base/make-base-image.sh [TAG]        (default veo-edge/base:bookworm-python3)
#
# The root filesystem tarball is cached in ${VEO_EDGE_CACHE:-$HOME/.cache/veo-edge} so that later
# runs on the same machine only `docker import` it. DOCKER_HOST selects the engine. Needs root and
# debootstrap (apt-get install debootstrap) the first time.
set -euo pipefail
TAG="${1:-veo-edge/base:bookworm-python3}"
CACHE="${VEO_EDGE_CACHE:-$HOME/.cache/veo-edge}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
TARBALL="$CACHE/base-bookworm-python3-slim.tar"

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "base image $TAG is already in the engine"
  exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.base-bookworm-python3.lock"
flock 9   # one debootstrap at a time: two engines starting together wait for the first's tarball
if [[ ! -s "$TARBALL" ]]; then
  command -v debootstrap >/dev/null || { echo "error: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 2; }
  work="$(mktemp -d "$CACHE/.rootfs-XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  echo "debootstrap bookworm (minbase + python3, python3-venv) into $work ..."
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; echo "error: debootstrap failed (log above)" >&2; exit 1; }
  # no apt caches or lists in the image
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  "$(dirname "$0")/slim-rootfs.sh" "$work/rootfs"
  tar -C "$work/rootfs" -cf "$work/base.tar" .
  mv "$work/base.tar" "$TARBALL"   # atomic: a killed run leaves no half tarball under the final name
fi
docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "$TARBALL" "$TAG" >/dev/null
echo "imported $TARBALL as $TAG"

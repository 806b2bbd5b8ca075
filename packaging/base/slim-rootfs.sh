#!/usr/bin/env bash
# Slim a debootstrapped root filesystem the way Debian's "-slim" images are (debuerreotype's slimify),
# which python:3.11-slim-bookworm, the cpu target's real base, is built on: no documentation, manual
# pages, info pages or message catalogues (licences stay), and a dpkg rule so that packages installed
# later leave them out too. Without it the stand-in base carried ~50 MB the real one does not.
#
#   packaging/base/slim-rootfs.sh ROOTFS
set -euo pipefail
root="${1:?usage: slim-rootfs.sh ROOTFS}"
[[ -d $root/usr/share ]] || { echo "error: $root is not a root filesystem (no usr/share)" >&2; exit 2; }
mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
CFG
find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root"/usr/share/{groff,info,linda,lintian/overrides,locale,man}/*

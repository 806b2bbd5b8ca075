"""What an image's venv does not need, taken out in its venv stage (both Dockerfiles run
``python -m veo_edge.packaging.prune VENV`` right after the wheelhouse is installed).

- Files no target runs: OpenVINO's Intel GPU/NPU plugins, GPU kernel cache, other frameworks' frontends,
  C++ headers and CMake files; numpy's tests; ONNX Runtime's Python tooling (quantization, transformers,
  tools) and, without the CUDA provider, its C API library (the Python module carries its own copy).
- Debug information in the venv's shared libraries (the ``.debug_*`` sections: what
  ``strip --strip-debug`` takes). Wheels ship it in some extensions: ml_dtypes' 25 MB module is 1.5 MB
  without it, uvloop's 13.6 MB, python-rapidjson's 7.2 MB; 44 MB of the cpu target's venv in all.
  The venv stage has no binutils (a slim base, no network), so the sections are dropped here, with the
  standard library: the loaded part of each file (every segment the dynamic loader maps) is kept byte for
  byte, the non-debug sections after it are moved up, the dropped ones stay in the section table as
  ``SHT_NOBITS`` (as ``objcopy --only-keep-debug`` marks what it leaves out). A file laid out in any other
  way (32-bit, big-endian, extended section numbering, a debug section inside the loaded part or linked
  from a kept one, bytes after the last section) is left as it is.

The SBOM and the lock still name every package; the image's signed manifest covers the files as pruned.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
from pathlib import Path

#: relative to site-packages: what no target runs (globs)
UNUSED = (
    "openvino/libs/libopenvino_intel_gpu_plugin.so",
    "openvino/libs/libopenvino_intel_npu_plugin.so",
    "openvino/libs/cache.json",
    "openvino/libs/libopenvino_*tensorflow*_frontend.so*",
    "openvino/libs/libopenvino_paddle_frontend.so*",
    "openvino/libs/libopenvino_pytorch_frontend.so*",
    "openvino/libs/libopenvino_jax_frontend.so*",
    "openvino/libs/libopenvino_gguf_frontend.so*",
    "openvino/include",
    "openvino/cmake",
    "numpy/tests",
    "numpy/*/tests",
    "onnxruntime/tools",
    "onnxruntime/transformers",
    "onnxruntime/quantization",
)
#: ONNX Runtime's C API library: only its CUDA provider loads it (the Python module has its own copy)
ORT_CAPI = "onnxruntime/capi/libonnxruntime.so.*"
ORT_CUDA = "onnxruntime/capi/libonnxruntime_providers_cuda.so"

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHT_NOBITS = 8
_SHF_ALLOC = 0x2
_SHF_INFO_LINK = 0x40
_SHN_LORESERVE = 0xFF00


def _remove(p: Path) -> int:
    if p.is_dir() and not p.is_symlink():
        n = sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
        for f in sorted(p.rglob("*"), key=lambda f: len(f.parts), reverse=True):
            f.rmdir() if f.is_dir() and not f.is_symlink() else f.unlink()
        p.rmdir()
        return n
    n = p.lstat().st_size
    p.unlink()
    return n


def remove_unused(site: Path) -> tuple[int, int]:
    """Delete what no target runs from ``site`` (a site-packages folder); (paths removed, bytes freed)."""
    site = Path(site)
    found = [p for pattern in UNUSED for p in site.glob(pattern)]
    if not (site / ORT_CUDA).exists():
        found += site.glob(ORT_CAPI)
    freed = sum(_remove(p) for p in found)
    return len(found), freed


def strip_debug(path: Path) -> int:
    """Drop the ``.debug_*`` sections of the ELF file ``path`` in place; the bytes saved (0: left as is).
    The file is replaced whole (written beside it, then renamed), keeping its mode."""
    path = Path(path)
    data = path.read_bytes()
    out = _without_debug(data)
    if out is None:
        return 0
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(out)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(data) - len(out)


def _without_debug(data: bytes) -> bytes | None:
    """``data`` (an ELF file) without its debug sections, or None where there are none or the file is not
    laid out as this function expects (see the module's docstring)."""
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None  # not ELF, not 64-bit, not little-endian
    eh = list(_EHDR.unpack_from(data))
    phoff, shoff, phentsize, phnum, shentsize, shnum, shstrndx = eh[5], eh[6], *eh[9:]
    if (
        shnum == 0
        or shentsize != _SHDR.size
        or phentsize != _PHDR.size
        or shstrndx >= _SHN_LORESERVE
        or shoff + shnum * shentsize > len(data)
        or phoff + phnum * phentsize > len(data)
    ):
        return None
    secs = [list(_SHDR.unpack_from(data, shoff + i * shentsize)) for i in range(shnum)]
    strtab = secs[shstrndx]
    names = data[strtab[4] : strtab[4] + strtab[5]]

    def name(s: list) -> bytes:
        return names[s[0] : names.index(b"\0", s[0])]

    def has_bytes(s: list) -> bool:
        return s[1] != _SHT_NOBITS and s[5] > 0

    drop = {
        i
        for i, s in enumerate(secs)
        if i and name(s).startswith(b".debug") and has_bytes(s) and not s[2] & _SHF_ALLOC
    }
    if not drop:
        return None
    # the loaded part: the headers, every segment's bytes and every allocated section, kept byte for byte
    loaded = max(
        [_EHDR.size, phoff + phnum * phentsize]
        + [p[2] + p[5] for p in (_PHDR.unpack_from(data, phoff + i * phentsize) for i in range(phnum))]
        + [s[4] + s[5] for s in secs if has_bytes(s) and s[2] & _SHF_ALLOC]
    )
    moved = sorted(
        (i for i, s in enumerate(secs) if has_bytes(s) and s[4] >= loaded), key=lambda i: secs[i][4]
    )
    ends = [s[4] + s[5] for s in secs if has_bytes(s)] + [shoff + shnum * shentsize]
    if (
        any(secs[i][4] < loaded for i in drop)
        or any(
            s[6] in drop or (s[2] & _SHF_INFO_LINK and s[7] in drop)
            for i, s in enumerate(secs)
            if i not in drop
        )
        or any(has_bytes(s) and s[4] < loaded < s[4] + s[5] for s in secs)
        or max(ends) < len(data)  # bytes after the last section: something this function does not know
    ):
        return None
    out = bytearray(data[:loaded])
    for i in moved:
        s = secs[i]
        if i in drop:
            continue
        out += b"\0" * (-len(out) % max(s[8], 1))
        out += data[s[4] : s[4] + s[5]]
        s[4] = len(out) - s[5]
    for i in drop:
        secs[i][1], secs[i][4] = _SHT_NOBITS, len(out)
    out += b"\0" * (-len(out) % 8)
    eh[6] = len(out)
    for s in secs:
        out += _SHDR.pack(*s)
    out[: _EHDR.size] = _EHDR.pack(*eh)
    return bytes(out)


def strip_tree(root: Path) -> tuple[int, int]:
    """Drop debug sections from every shared library under ``root``; (files changed, bytes saved)."""
    changed = saved = 0
    for p in sorted(Path(root).rglob("*.so*")):
        if p.is_file() and not p.is_symlink():
            n = strip_debug(p)
            changed, saved = changed + bool(n), saved + n
    return changed, saved


def prune_venv(venv: Path) -> str:
    """Prune the venv at ``venv`` (see the module's docstring); one line that says what went."""
    sites = sorted(Path(venv).glob("lib/python3*/site-packages"))
    if not sites:
        raise SystemExit(f"error: {venv} has no lib/python3*/site-packages; pass the venv's root folder")
    removed = freed = changed = saved = 0
    for site in sites:
        r, f = remove_unused(site)
        c, s = strip_tree(site)
        removed, freed, changed, saved = removed + r, freed + f, changed + c, saved + s
    return (
        f"pruned {venv}: {removed} unused paths ({freed / 1e6:.1f} MB), debug sections of {changed} "
        f"shared libraries ({saved / 1e6:.1f} MB)"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m veo_edge.packaging.prune VENV")
    print(prune_venv(Path(sys.argv[1])))

"""The venv prune both Dockerfiles run (veo_edge.packaging.prune), on real files of this venv: a wheel's
extension module loses its debug sections, keeps every loaded byte and still imports and computes; files
it does not know how to rewrite stay as they are; what no target runs exists where the list says (so a
package upgrade that moves it shows here) and goes. The images themselves: tests/packaging/test_image_cpu.py
and tools/arm64_check.py."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from veo_edge.packaging import prune

ml_dtypes = pytest.importorskip("ml_dtypes")
SITE = Path(ml_dtypes.__file__).parents[1]


def _segments(data: bytes) -> list[bytes]:
    """The bytes of every program header's file range (what the dynamic loader maps), the ELF header's
    section table offset (e_shoff, which the loader does not read) left out."""
    data = data[:40] + bytes(8) + data[48:]
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 32)[0], *struct.unpack_from("<HH", data, 54)
    out = []
    for i in range(phnum):
        off, filesz = struct.unpack_from("<8xQ16xQ", data, phoff + i * phentsize)
        out.append(data[off : off + filesz])
    return out


def _section_names(data: bytes) -> dict[bytes, int]:
    """Section name -> type."""
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = secs[shstrndx]
    names = data[strtab[4] : strtab[4] + strtab[5]]
    return {names[s[0] : names.index(b"\0", s[0])]: s[1] for s in secs}


def test_debug_sections_go_the_loaded_bytes_stay_and_the_module_still_works(tmp_path: Path) -> None:
    pkg = tmp_path / "ml_dtypes"
    shutil.copytree(Path(ml_dtypes.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (ext,) = pkg.glob("_ml_dtypes_ext*.so")
    before = ext.read_bytes()
    assert any(n.startswith(b".debug") for n in _section_names(before)), "the wheel's module has debug info"
    mode = ext.stat().st_mode

    changed, saved = prune.strip_tree(tmp_path)

    after = ext.read_bytes()
    assert changed == 1 and saved == len(before) - len(after) > len(before) // 2
    assert _segments(after) == _segments(before)
    types = _section_names(after)
    assert types.keys() == _section_names(before).keys()
    assert all(t == 8 for n, t in types.items() if n.startswith(b".debug")), "dropped sections are NOBITS"
    assert ext.stat().st_mode == mode and not list(tmp_path.glob("ml_dtypes/.*")), "no temp file left"
    code = (
        f"import ml_dtypes, numpy as np; assert ml_dtypes.__file__.startswith({str(tmp_path)!r}); "
        "print((np.array([1.5, 2.25], dtype=ml_dtypes.bfloat16) * 2).astype(np.float32).tolist())"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[3.0, 4.5]"
    assert prune.strip_debug(ext) == 0, "a second pass finds nothing to drop"


def test_files_it_cannot_rewrite_are_left_as_they_are(tmp_path: Path) -> None:
    (ext,) = Path(ml_dtypes.__file__).parent.glob("_ml_dtypes_ext*.so")
    trailing = tmp_path / "trailing.so"
    trailing.write_bytes(ext.read_bytes() + b"payload after the last section")
    text = tmp_path / "notes.so.txt"
    text.write_text("not an ELF file")
    elf32 = tmp_path / "elf32.so"
    elf32.write_bytes(b"\x7fELF\x01\x01\x01" + bytes(60))
    originals = {p: p.read_bytes() for p in (trailing, text, elf32)}
    assert prune.strip_tree(tmp_path) == (0, 0)
    assert {p: p.read_bytes() for p in originals} == originals


def test_what_no_target_runs_is_where_the_list_says_and_goes(tmp_path: Path) -> None:
    for pattern in (*prune.UNUSED, prune.ORT_CAPI):
        assert list(SITE.glob(pattern)), f"{pattern} matches nothing in this venv: a package moved it"
    # a site-packages folder with those paths (the real files are large; their names are what matters)
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for pattern in (*prune.UNUSED, prune.ORT_CAPI):
        for p in SITE.glob(pattern):
            dst = site / p.relative_to(SITE)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.mkdir() if p.is_dir() else dst.write_bytes(b"x")
            if p.is_dir():
                (dst / "kept_inside.py").write_text("")
    keep = [site / "openvino" / "libs" / "libopenvino_intel_cpu_plugin.so", site / "numpy" / "__init__.py"]
    for p in keep:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"y")
    line = prune.prune_venv(tmp_path / "venv")
    assert "unused paths" in line
    assert all(p.exists() for p in keep)
    assert not [p for pattern in (*prune.UNUSED, prune.ORT_CAPI) for p in site.glob(pattern)]
    # with ONNX Runtime's CUDA provider, its C API library stays (the provider loads it)
    capi = site / "onnxruntime" / "capi"
    (capi / "libonnxruntime.so.1.32.0").write_bytes(b"x")
    (capi / "libonnxruntime_providers_cuda.so").write_bytes(b"x")
    prune.prune_venv(tmp_path / "venv")
    assert (capi / "libonnxruntime.so.1.32.0").exists()


def test_a_folder_that_is_not_a_venv_is_one_clear_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "veo_edge.packaging.prune", str(tmp_path)], capture_output=True, text=True
    )
    assert run.returncode == 1
    assert (
        run.stderr.strip()
        == f"error: {tmp_path} has no lib/python3*/site-packages; pass the venv's root folder"
    )

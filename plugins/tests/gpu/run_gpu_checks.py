#!/usr/bin/env python3
"""The GPU checks of veo-edge in one call: kernels vs PyTorch, compute-sanitizer, the pool, TensorRT.

Needs a CUDA GPU, PyTorch with CUDA, numpy, cmake and nvcc; compute-sanitizer and TensorRT where they
are installed (their sections are skipped, with the reason, where not). From the repository root:

    python plugins/tests/gpu/run_gpu_checks.py            # build build/plugins-gpu, run every section
    python plugins/tests/gpu/run_gpu_checks.py --quick    # smaller sweeps
    python plugins/tests/gpu/run_gpu_checks.py --list     # what would run here, and why not the rest
    python plugins/tests/gpu/run_gpu_checks.py --sections pool --pool-backend host   # runs on a CPU too

Sections (``--sections``, default all):

- ``kernels``: every case on fresh seeded random inputs: outputs filled with NaN first (every element must
  be written), the kernel's max abs error against ``veo_edge.surgery.reference`` (float64) at most 2x
  PyTorch's own error (SDPA; conv + LayerNorm) in the same precision plus a floor (FlashAttention's
  criterion), both timed with CUDA events (median of 20 after warm-up).
- ``sanitizer``: the kernels on a tiny sweep under ``compute-sanitizer --tool memcheck`` and ``racecheck``.
- ``pool``: alloc/free storms on two CUDA streams through the pool's C ABI, checked byte for byte, with
  fragmentation, fence-wait and overflow stats.
- ``tensorrt``: a vit-nano build, plugin and plain engines built, serialised, deserialised into the pool,
  compared and timed (the engine choice), batch 1..max, two execution contexts at once, parity.

Exit status 1 when any check fails, 2 when a section that was asked for cannot run here. This script
plans the sections and runs them; each lives in its own module (``checks_kernels.py`` for kernels and
sanitizer, ``checks_pool.py``, ``checks_tensorrt.py``), imported only when its section runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # checks_kernels, checks_pool, checks_tensorrt

SECTIONS = ("kernels", "sanitizer", "pool", "tensorrt")


def plan(sections: list[str], pool_backend: str) -> list[tuple[str, str | None]]:
    """(section, why it cannot run here or None) for each section asked for; no GPU is touched."""
    import importlib.util
    import shutil

    has = lambda mod: importlib.util.find_spec(mod) is not None  # noqa: E731
    torch_cuda = None
    if has("torch"):
        import torch

        torch_cuda = None if torch.cuda.is_available() else "PyTorch sees no CUDA device"
    else:
        torch_cuda = "PyTorch is not installed"
    why = {
        "kernels": torch_cuda or (None if shutil.which("nvcc") or shutil.which("cmake") else "no nvcc/cmake"),
        "sanitizer": torch_cuda
        or (None if shutil.which("compute-sanitizer") else "compute-sanitizer is not on PATH"),
        "pool": None if pool_backend == "host" else torch_cuda,
        "tensorrt": torch_cuda
        or (None if has("tensorrt") else "the tensorrt Python package is not installed"),
    }
    return [(name, why[name]) for name in sections]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", type=Path, help="libveo_kernels.so to test (default: build build/plugins-gpu)")
    ap.add_argument("--quick", action="store_true", help="smaller shape sweeps")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the sanitizer's sweep
    ap.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated, of: {', '.join(SECTIONS)}"
    )
    ap.add_argument(
        "--pool-backend", choices=("cuda", "host"), default="cuda", help="where the pool storm runs"
    )
    ap.add_argument("--mempool-lib", type=Path, help="libveo_mempool.so (default: the built one)")
    ap.add_argument("--list", action="store_true", help="print what would run here, and why not the rest")
    args = ap.parse_args(argv)
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    todo = plan(sections, args.pool_backend)
    if args.list:
        for name, why in todo:
            print(f"{name:<10} {'runs' if why is None else 'skipped: ' + why}")
        return 0
    t0 = time.time()
    ok, skipped = True, []
    lib_path = None
    for name, why in todo:
        if why is not None:
            print(f"== {name}: SKIPPED ({why})")
            skipped.append(name)
            continue
        print(f"== {name}")
        if name in ("kernels", "sanitizer"):
            import checks_kernels

            if lib_path is None:
                lib_path = args.lib or checks_kernels.build(REPO / "build" / "plugins-gpu")
        if name == "kernels":
            import torch

            print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  lib {lib_path}")
            ok &= checks_kernels.run(torch, lib_path, args.quick, args.tiny)
        elif name == "sanitizer":
            ok &= checks_kernels.run_sanitizer(Path(__file__), lib_path)
        elif name == "pool":
            import checks_pool

            torch = None
            if args.pool_backend == "cuda":
                import torch
            passed, line = checks_pool.run(args.pool_backend, args.mempool_lib, torch)
            print(line, "PASS" if passed else "FAIL")
            ok &= passed
        elif name == "tensorrt":
            import checks_tensorrt

            passed, lines = checks_tensorrt.run(reps=10 if args.quick else 20)
            print("\n".join(lines))
            print(f"tensorrt: {'PASS' if passed else 'FAIL'}")
            ok &= passed
    print(f"done in {time.time() - t0:.0f}s: {'all passed' if ok else 'FAILURES'}"
          + (f"; skipped: {', '.join(skipped)}" if skipped else ""))  # fmt: skip
    if not ok:
        return 1
    return 2 if skipped and args.sections != ",".join(SECTIONS) else 0


if __name__ == "__main__":
    sys.exit(main())

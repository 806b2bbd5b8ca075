#!/usr/bin/env python3
"""The GPU checks of veo-edge in one call: kernels vs PyTorch, compute-sanitizer, the pool, TensorRT.

Needs a CUDA GPU, PyTorch with CUDA, numpy, cmake and nvcc; compute-sanitizer and TensorRT where they
are installed (their sections are skipped, with the reason, where not). From the repository root of a
fresh checkout, one command:

    python plugins/tests/gpu/run_gpu_checks.py            # build build/plugins-gpu, run every section
    python plugins/tests/gpu/run_gpu_checks.py --quick    # smaller sweeps
    python plugins/tests/gpu/run_gpu_checks.py --list     # what would run here, and why not the rest
    python plugins/tests/gpu/run_gpu_checks.py --sections pool --pool-backend host   # runs on a CPU too

First, one native build (``checks_build.py``): ``build/plugins-gpu`` (``--build-dir``) configured and built
once, with the pool, the kernels and, where TensorRT's headers and library are found (``TensorRT_ROOT``),
the plugin library; its ctest suite runs; and ``VEO_EDGE_MEMPOOL_LIB`` / ``VEO_EDGE_PLUGIN_LIB`` point at
it, so every section (and the ``veo-edge build`` the TensorRT section starts) uses the same libraries.
``--lib`` / ``--mempool-lib`` use given libraries instead (no build when nothing else needs one).

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
- ``cudashm``: ``veo-edge serve`` with inputs and outputs in CUDA memory another process exported
  (tritonclient's ``utils.cuda_shared_memory``), HTTP and gRPC, against the same input sent inline; bad
  regions are 400s; ``--model-dir`` serves a given build (default: a vit-nano build made here).

Exit status 1 when any check fails, 2 when a section that was asked for cannot run here. This script
plans the sections and runs them; each lives in its own module (``checks_kernels.py`` for kernels and
sanitizer, ``checks_pool.py``, ``checks_tensorrt.py``, ``checks_cudashm.py``), imported only when its section runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # checks_kernels, checks_pool, checks_tensorrt

SECTIONS = ("kernels", "sanitizer", "pool", "tensorrt", "cudashm")


def plan(
    sections: list[str], pool_backend: str, model_dir: Path | None = None
) -> list[tuple[str, str | None]]:
    """(section, why it cannot run here or None) for each section asked for; no GPU is touched."""
    import importlib
    import importlib.util
    import shutil

    has = lambda mod: importlib.util.find_spec(mod) is not None  # noqa: E731
    torch_cuda = None
    if has("torch"):
        import torch

        torch_cuda = None if torch.cuda.is_available() else "PyTorch sees no CUDA device"
    else:
        torch_cuda = "PyTorch is not installed"
    no_trt = None
    try:  # imported, not only found: a wheel without its libnvinfer fails here, not mid-section
        importlib.import_module("tensorrt")
    except Exception as e:  # ImportError, or an OSError from a library it loads
        no_trt = f"tensorrt does not import ({type(e).__name__}: {e})"
    no_cudashm = None
    if model_dir is None and not has("openvino"):  # the vit-nano build it would make needs OpenVINO
        no_cudashm = (
            "no --model-dir, and OpenVINO, which `veo-edge build` needs to make one, is not installed: "
            "pass --model-dir with a build made elsewhere (veo-edge build --model vit-nano)"
        )
    for mod in ("tritonclient.http", "tritonclient.grpc", "tritonclient.utils.cuda_shared_memory", "uvicorn"):
        try:
            importlib.import_module(mod)
        except Exception as e:  # a missing client or server package, or cuda-python under tritonclient
            no_cudashm = no_cudashm or f"{mod} does not import ({type(e).__name__}: {e})"
    tools = (
        None
        if shutil.which("nvcc") and shutil.which("cmake")
        else "nvcc and cmake are needed to build the kernels"
    )
    why = {
        "kernels": torch_cuda or tools,
        "sanitizer": torch_cuda
        or tools
        or (None if shutil.which("compute-sanitizer") else "compute-sanitizer is not on PATH"),
        "pool": None if pool_backend == "host" else torch_cuda,
        "tensorrt": torch_cuda or no_trt,
        "cudashm": torch_cuda or no_cudashm,
    }
    return [(name, why[name]) for name in sections]


def _nano(where: Path) -> Path:
    """A vit-nano build for the cudashm section (needs veo-edge's export dependencies)."""
    import subprocess

    out = where / "gpu-checks-vit-nano"
    subprocess.run([sys.executable, "-m", "veo_edge", "build", "--model", "vit-nano", "--out", str(out),
                    "--force"], check=True, cwd=REPO)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", type=Path, help="libveo_kernels.so to test (default: the one built here)")
    ap.add_argument("--quick", action="store_true", help="smaller shape sweeps")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the sanitizer's sweep
    ap.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated, of: {', '.join(SECTIONS)}"
    )
    ap.add_argument(
        "--pool-backend", choices=("cuda", "host"), default="cuda", help="where the pool storm runs"
    )
    ap.add_argument("--mempool-lib", type=Path, help="libveo_mempool.so (default: the one built here)")
    ap.add_argument(
        "--build-dir", type=Path, help="where the one native build goes (default: build/plugins-gpu)"
    )
    ap.add_argument(
        "--model-dir", type=Path, help="the build cudashm serves (default: veo-edge build --model vit-nano)"
    )
    ap.add_argument(
        "--sanitizer-timeout", type=float, default=240, help="seconds each compute-sanitizer tool may take"
    )
    ap.add_argument(
        "--ops", default="attention,bias,patch", help="kernels section: of attention, bias, patch"
    )
    ap.add_argument("--list", action="store_true", help="print what would run here, and why not the rest")
    args = ap.parse_args(argv)
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    todo = plan(sections, args.pool_backend, args.model_dir)
    runs = {name for name, why in todo if why is None}
    # the build is needed by whatever runs and was not given its library
    need_build = bool(
        (runs & {"kernels", "sanitizer"} and args.lib is None)
        or ("pool" in runs and args.mempool_lib is None)
        or "tensorrt" in runs
    )
    if args.list:
        if need_build:
            print(f"{'build':<10} runs: {args.build_dir or 'build/plugins-gpu'} (cmake, ctest)")
        for name, why in todo:
            print(f"{name:<10} {'runs' if why is None else 'skipped: ' + why}")
        return 0
    t0 = time.time()
    ok, skipped = True, []
    lib_path, mempool_lib = args.lib, args.mempool_lib
    if need_build:
        import checks_build

        try:
            built = checks_build.build(args.build_dir or checks_build.DEFAULT_DIR)
        except checks_build.BuildFailed as e:
            print(f"== build: FAIL\n{e}")
            return 1
        print("== build\n" + "\n".join(built.lines()))
        ok &= built.ctest_ok
        checks_build.export(built)
        lib_path = lib_path or built.kernels
        mempool_lib = mempool_lib or built.mempool
    for name, why in todo:
        if why is not None:
            print(f"== {name}: SKIPPED ({why})")
            skipped.append(name)
            continue
        print(f"== {name}")
        if name in ("kernels", "sanitizer") and lib_path is None:
            print(f"{name}: FAIL (libveo_kernels.so was not built: nvcc was not found at configure time)")
            ok = False
            continue
        if name == "kernels":
            import checks_kernels
            import torch

            print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  lib {lib_path}")
            ok &= checks_kernels.run(torch, lib_path, args.quick, args.tiny, tuple(args.ops.split(",")))
        elif name == "sanitizer":
            import checks_kernels

            ok &= checks_kernels.run_sanitizer(Path(__file__), lib_path, args.sanitizer_timeout)
        elif name == "pool":
            import checks_pool

            torch = None
            if args.pool_backend == "cuda":
                import torch
            passed, line = checks_pool.run(args.pool_backend, mempool_lib, torch)
            print(line, "PASS" if passed else "FAIL")
            ok &= passed
        elif name == "tensorrt":
            import checks_tensorrt

            passed, lines = checks_tensorrt.run(reps=10 if args.quick else 20)
            print("\n".join(lines))
            print(f"tensorrt: {'PASS' if passed else 'FAIL'}")
            ok &= passed
        elif name == "cudashm":
            import checks_cudashm

            logs = args.build_dir.parent if args.build_dir else REPO / "build"
            logs.mkdir(parents=True, exist_ok=True)
            passed, lines = checks_cudashm.run(args.model_dir or _nano(logs), logs)
            print("\n".join(lines))
            print(f"cudashm: {'PASS' if passed else 'FAIL'}")
            ok &= passed
    print(f"done in {time.time() - t0:.0f}s: {'all passed' if ok else 'FAILURES'}"
          + (f"; skipped: {', '.join(skipped)}" if skipped else ""))  # fmt: skip
    if not ok:
        return 1
    return 2 if skipped and args.sections != ",".join(SECTIONS) else 0


if __name__ == "__main__":
    sys.exit(main())

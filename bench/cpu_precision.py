"""OpenVINO on the CPU at f32, bf16 and int8: throughput through ``veo_edge.Runtime``, in-process.

    python bench/cpu_precision.py [--models vit-digits,vit-tiny] [--rounds 5] [--seconds 1.0]
                                  [--builds DIR] [--max-batch 8]

Builds each model at each --cpu-precision (into --builds, reused when present; vit-tiny is calibrated on
64 seeded inputs, vit-digits on its own training split), starts one Runtime per precision, then runs the
precisions interleaved (round-robin, order rotated every round) at batch 1 and at the max batch, for
--seconds each turn. Prints the median samples/s per precision and the ratios to f32, and for vit-digits
the top-1 accuracy of each precision on its real test split. Timings on a shared machine are noisy:
read the ratios, and rerun.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

import veo_edge
from veo_edge.export.accuracy import top1_points
from veo_edge.export.parity import seeded_inputs
from veo_edge.export.source import BuiltinSource
from veo_edge.pipeline.build import BuildOptions, run_build

PRECISIONS = ("f32", "bf16", "int8")


def build(root: Path, model: str, precision: str, max_batch: int) -> Path:
    out = root / f"{model}-{precision}"
    if (out / "manifest.json").is_file():
        return out
    calibration = None
    if precision == "int8" and model != "vit-digits":
        from veo_edge.models import get_config

        calibration = root / f"{model}-calibration.npy"
        np.save(calibration, seeded_inputs(get_config(model).input_shape, 64, 99))
    t = time.perf_counter()
    run_build(
        BuildOptions(
            BuiltinSource(model),
            out=out,
            max_batch=max_batch,
            quiet=True,
            plugins=False,
            cpu_precision=precision,
            calibration=calibration,
        )
    )
    print(f"built {out} in {time.perf_counter() - t:.0f} s", flush=True)
    return out


def throughput(rt: veo_edge.Runtime, x: np.ndarray, seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or n < 3:
        rt.infer(x)
        n += 1
    return n * len(x) / elapsed


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(
        f for f in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit-digits,vit-tiny")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--builds", type=Path, default=Path("/tmp/veo-edge-bench-cpu-precision"))
    args = ap.parse_args()
    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    for model in args.models.split(","):
        paths = {p: build(args.builds, model, p, args.max_batch) for p in PRECISIONS}
        runtimes = {p: veo_edge.Runtime(paths[p], backend="openvino").start() for p in PRECISIONS}
        try:
            served = {p: runtimes[p].describe()["precision"] for p in PRECISIONS}
            shape = runtimes["f32"].input_shape
            print(f"\n{model}: served precisions {served}")
            if model == "vit-digits":
                from veo_edge.models.digits import test_split

                test = test_split()
                acc = {p: top1_points(runtimes[p].infer(test.x), test.y) for p in PRECISIONS}
                print("  top-1 on the 540 test scans: " + ", ".join(f"{p} {v:.2f}%" for p, v in acc.items()))
            for batch in sorted({1, args.max_batch}):
                x = seeded_inputs(shape, batch, 3)
                for p in PRECISIONS:
                    runtimes[p].infer(x)  # warm-up: infer requests and buffers for this batch size
                rates: dict[str, list[float]] = {p: [] for p in PRECISIONS}
                for r in range(args.rounds):
                    order = PRECISIONS[r % 3 :] + PRECISIONS[: r % 3]
                    for p in order:
                        rates[p].append(throughput(runtimes[p], x, args.seconds))
                med = {p: statistics.median(v) for p, v in rates.items()}
                spread = {p: (min(v), max(v)) for p, v in rates.items()}
                print(
                    f"  batch {batch}: "
                    + ", ".join(
                        f"{p} {med[p]:.1f}/s [{spread[p][0]:.0f}-{spread[p][1]:.0f}]" for p in PRECISIONS
                    )
                    + f"; bf16/f32 {med['bf16'] / med['f32']:.2f}x, int8/f32 {med['int8'] / med['f32']:.2f}x"
                )
        finally:
            for rt in runtimes.values():
                rt.close()


if __name__ == "__main__":
    main()

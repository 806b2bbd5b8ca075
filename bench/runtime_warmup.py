"""What `Runtime.warm_up` (what `veo-edge serve` does before it listens) changes: resident memory when
ready and after traffic of every batch size, the warm-up's own time, and the infer requests created.

Each case runs in a fresh process (memory is the process's): start the runtime, warm it or not, then
every batch size once alone and twice as two concurrent batches. Run from anywhere::

    python bench/runtime_warmup.py --build-dir DIR [--hint ADAPTIVE] [--repeat 2]

Prints one line per case: start-up and warm-up seconds, RSS when ready and after the traffic (MiB),
infer requests after the traffic, and the sum over batch sizes of each size's first call minus the
median of its later ones (ms; on a shared machine this moves by tens of ms either way).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def one_case(build_dir: str, hint: str, warm: bool) -> dict:
    import numpy as np

    from veo_edge.runtime.runtime import Runtime

    t0 = time.perf_counter()
    rt = Runtime(build_dir, backend="openvino", performance_hint=hint).start()
    start_s = time.perf_counter() - t0
    warmed = rt.warm_up() if warm else None
    ready = _rss_mib()
    x = np.random.default_rng(0).random((rt.max_batch, *rt.input_shape), dtype=np.float32)
    first_excess = 0.0
    for b in range(1, rt.max_batch + 1):
        ts = []
        for _ in range(4):
            t = time.perf_counter()
            rt.infer(x[:b])
            ts.append((time.perf_counter() - t) * 1e3)
        first_excess += ts[0] - statistics.median(ts[1:])
    with ThreadPoolExecutor(2) as pool:
        for b in range(1, rt.max_batch + 1):
            for _ in range(2):
                list(pool.map(lambda _, b=b: rt.submit_many(x[:b])[-1].result(timeout=120), range(2)))
    described = rt.describe()
    after = _rss_mib()
    rt.close()
    return {
        "case": "warmed" if warm else "cold",
        "precision": described["precision"],
        "start_s": round(start_s, 2),
        "warmup_s": warmed["seconds"] if warmed else None,
        "rss_ready_mib": round(ready),
        "rss_after_mib": round(after),
        "infer_requests": described.get("infer_requests"),
        "first_call_excess_ms": round(first_excess, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--hint", default="ADAPTIVE", choices=["LATENCY", "THROUGHPUT", "ADAPTIVE"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--case", choices=["warmed", "cold"], help=argparse.SUPPRESS)  # the child's
    args = ap.parse_args()
    if args.case:
        print(json.dumps(one_case(args.build_dir, args.hint, args.case == "warmed")))
        return
    for _ in range(args.repeat):
        for case in ("cold", "warmed"):
            cmd = [
                sys.executable,
                __file__,
                "--build-dir",
                args.build_dir,
                "--hint",
                args.hint,
                "--case",
                case,
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{r['case']:6s} {args.hint} {r['precision']}: start {r['start_s']:.2f} s, warm-up "
                f"{r['warmup_s'] if r['warmup_s'] is not None else '-'} s, RSS ready {r['rss_ready_mib']} MiB, "
                f"after traffic {r['rss_after_mib']} MiB, infer requests {r['infer_requests']}, "
                f"first-call excess {r['first_call_excess_ms']:+.1f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()

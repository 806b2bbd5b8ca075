"""What verifying a build at load adds to ``veo-edge serve`` start-up (default: vit-tiny).

    python bench/verify_startup.py [--build-dir DIR] [--model vit-tiny] [--repeats 5] [--serve-repeats 3]

1. ``veo_edge.builddir.verify``: every artifact hashed (page cache warm, as at a restart), median of
   --repeats: milliseconds, MiB and GB/s.
2. What ``Runtime(...).start()`` hashes on the default policy (its candidates' artifacts, a fresh
   BuildDir): the time verification adds to the start. Beside it, the start itself with that
   verification and without it (a BuildDir already verified: a stat per artifact), interleaved, median
   of --repeats each (on a busy machine their difference is noisier than the hash time).
3. ``veo-edge serve --port 0`` from the process start until ``/v2/health/ready`` answers 200, median of
   --serve-repeats: the start-up a user waits for, and the share of it the verification takes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from _server import build_dir, server


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=None, help="default: a fresh build of --model")
    ap.add_argument("--model", default="vit-tiny")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--serve-repeats", type=int, default=3)
    args = ap.parse_args()

    from veo_edge.builddir import BuildDir, verify
    from veo_edge.runtime.policy import artifacts_of, resolve_policy
    from veo_edge.runtime.runtime import Runtime

    with build_dir(args.build_dir, args.model) as build:
        report = verify(build)  # also warms the page cache
        verify_s = _median_s(lambda: verify(build), args.repeats)

        names, _ = resolve_policy("auto", None, True)
        kinds = sorted({k for n in names for k in artifacts_of(n, BuildDir.open(build))})
        start_bytes = sum(BuildDir.open(build).manifest["artifacts"][k]["bytes"] for k in kinds)

        # what the runtime's start hashes: its candidates' artifacts, on a fresh BuildDir
        kinds_s = _median_s(lambda: BuildDir.open(build).verify(kinds), args.repeats)

        def start(pre_verified: bool) -> float:
            b = BuildDir.open(build)
            if pre_verified:
                b.verify(kinds)
            rt = Runtime(b)
            t = time.perf_counter()
            rt.start()
            elapsed = time.perf_counter() - t
            rt.close()
            return elapsed

        rows: dict[str, list[float]] = {"with verification": [], "without (pre-verified)": []}
        for _ in range(args.repeats):  # interleaved, so that a busy machine weighs on both alike
            rows["with verification"].append(start(False))
            rows["without (pre-verified)"].append(start(True))

        serve_s = []
        for _ in range(args.serve_repeats):
            t = time.perf_counter()
            with server(build):
                serve_s.append(time.perf_counter() - t)

    starts = {k: statistics.median(v) for k, v in rows.items()}
    serve = statistics.median(serve_s)
    result = {
        "model": args.model,
        "build_bytes": report.bytes,
        "verify_all_ms": round(verify_s * 1e3, 1),
        "verify_all_GBps": round(report.bytes / verify_s / 1e9, 2),
        "runtime_start_kinds": kinds,
        "runtime_start_bytes": start_bytes,
        "added_by_verification_ms": round(kinds_s * 1e3, 1),
        "runtime_start_ms": {k: round(v * 1e3, 1) for k, v in starts.items()},
        "serve_to_ready_s": round(serve, 2),
        "added_share_of_serve_start": round(kinds_s / serve, 4),
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    print(
        f"{args.model}: verification adds {kinds_s * 1e3:.0f} ms to the runtime's start "
        f"({start_bytes / 2**20:.1f} MiB hashed; start with/without: {starts['with verification'] * 1e3:.0f}/"
        f"{starts['without (pre-verified)'] * 1e3:.0f} ms), {100 * kinds_s / serve:.1f}% of `veo-edge serve` to "
        f"ready ({serve:.2f} s); the whole build verifies in {verify_s * 1e3:.0f} ms "
        f"({report.bytes / verify_s / 1e9:.2f} GB/s)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

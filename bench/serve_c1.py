"""One client: `veo-edge serve` p50 against raw OpenVINO sync batch 1, measured in pairs.

    python bench/serve_c1.py --build-dir DIR --perf-analyzer PATH [--hint ADAPTIVE,LATENCY]
                             [--pairs 8] [--seconds 2] [--transport http] [--checkout OLD_TREE]

The issue's 1-client target is "p50 within 1 ms of raw sync batch 1". On a shared machine whose speed
drifts 10-15 % within the hour (and by a few ms between minutes on a 17 ms model), one raw measurement
and one served one taken minutes apart compare the drift more than the server. Here every pair is a raw
sync cell (one LATENCY compile, batch 1, back to back, in this process) followed at once by one
perf_analyzer cell at concurrency 1 against each server (one ``veo-edge serve`` per ``--hint``, all up
for the whole run); the report is the median over pairs of the served p50 minus that pair's raw p50,
with its spread, and the server's own split of each request (queue and compute from
``/v2/models/NAME/stats``; the rest is HTTP, parsing and the client). ``--checkout DIR`` also serves
the ``veo_edge`` package in DIR (``PYTHONPATH=DIR``, the first hint), to measure a change in the same
pairs. Bounded in time, loopback only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import urllib.request
from pathlib import Path

from _server import build_dir, sample, server
from serve_limit import perf_analyzer, served_ir, sync_request, time_sync


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=None, help="default: a fresh build of --model")
    ap.add_argument("--model", default="vit-tiny")
    ap.add_argument("--hint", default="ADAPTIVE,LATENCY", help="one server per --performance-hint")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=2.0, help="per cell")
    ap.add_argument("--transport", default="http", choices=("http", "grpc"))
    ap.add_argument("--perf-analyzer", required=True, help="Triton's perf_analyzer binary")
    ap.add_argument("--checkout", default=None, help="also serve the veo_edge of this tree (first hint)")
    args = ap.parse_args()
    from veo_edge.builddir import BuildDir

    hints = [h.strip().upper() for h in args.hint.split(",") if h.strip()]
    with build_dir(args.build_dir, args.model) as build, contextlib.ExitStack() as stack:
        bd = BuildDir.open(build)
        precision, xml = served_ir(bd)
        x = sample(build, 1)
        request = sync_request(xml)  # compiled once: every pair's raw cell runs it

        ports = {h: stack.enter_context(server(build, "--performance-hint", h, ports=True)) for h in hints}
        if args.checkout:
            env = {"PYTHONPATH": str(Path(args.checkout).resolve())}
            old = server(build, "--performance-hint", hints[0], ports=True, env=env)
            hints.append(f"old-{hints[0]}")
            ports[hints[-1]] = stack.enter_context(old)
        name = bd.model_name

        def stats(port: int) -> tuple[int, int, int]:
            url = f"http://127.0.0.1:{port}/v2/models/{name}/stats"
            with urllib.request.urlopen(url, timeout=10) as r:
                s = json.load(r)["model_stats"][0]["inference_stats"]
            return s["success"]["count"], s["queue"]["ns"], s["compute_infer"]["ns"]

        print(
            f"{name} ({precision} IR), 1 client over {args.transport}, {args.pairs} pairs of "
            f"{args.seconds:g} s cells; ms"
        )
        raws: list[float] = []
        rows: dict[str, list[tuple[float, float, float]]] = {h: [] for h in hints}  # p50, queue, compute
        for i in range(args.pairs):
            raws.append(time_sync(request, x, args.seconds)["p50"] / 1e3)
            line = [f"pair {i + 1}: raw {raws[-1]:6.2f}"]
            for h in hints:
                before = stats(ports[h]["http"])
                r = perf_analyzer(
                    args.perf_analyzer, args.transport, ports[h][args.transport], name, 1, args.seconds
                )
                after = stats(ports[h]["http"])
                n = max(1, after[0] - before[0])
                queue, compute = ((a - b) / n / 1e6 for a, b in zip(after[1:], before[1:], strict=True))
                rows[h].append((r["p50"] / 1e3, queue, compute))
                line.append(f"{h.lower()} {r['p50'] / 1e3:6.2f} ({r['p50'] / 1e3 - raws[-1]:+5.2f})")
            print("  ".join(line), flush=True)
        print(f"raw sync p50: median {statistics.median(raws):.2f} (range {min(raws):.2f}-{max(raws):.2f})")
        print(f"{'':10} {'p50-raw':>8} {'range':>13} {'queue':>6} {'compute-raw':>11} {'rest':>6}")
        for h in hints:
            p50 = [p for p, _, _ in rows[h]]
            d = [p - raw for p, raw in zip(p50, raws, strict=True)]
            dc = [c - raw for (_, _, c), raw in zip(rows[h], raws, strict=True)]
            rest = [p - q - c for p, q, c in rows[h]]
            print(
                f"{h.lower():10} {statistics.median(d):+8.2f} {min(d):+6.2f}..{max(d):+5.2f} "
                f"{statistics.median(q for _, q, _ in rows[h]):6.2f} {statistics.median(dc):+11.2f} "
                f"{statistics.median(rest):6.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())

"""A change to the serving path, measured request by request: two `veo-edge serve`, one per tree, at 1 client.

    python bench/serve_ab.py --old OLD_TREE [--new NEW_TREE] [--build-dir DIR] [--requests 600] [--runs 4]
                             [--burst 200]

On a shared machine a 17 ms model's p50 moves by milliseconds between minutes, so two cells taken one
after the other (``serve_c1.py``) cannot resolve a change of 0.1 ms. Here one client alternates every
request between the server of the old tree and that of the new one (in a random order per pair), and
the result is the median of the paired differences, with a bootstrap 95 % interval. The two servers are
not interchangeable even on the same tree (the one started second answered 0.1-0.3 ms faster in an
A/A run here), so each run starts them in turn (old first, then new first) and the net effect is half
the difference between the two orders, averaged over the runs. The client is the standard library's
HTTP client with a binary request as perf_analyzer sends it; its own cost is the same for both.
Loopback only, bounded in requests.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

from _server import build_dir, http_infer, median_ci, server


def burst(build: Path, port: int, n: int, clients: int = 4) -> None:
    """``n`` requests from ``clients`` concurrent clients: the server runs its concurrent paths (e.g.
    ADAPTIVE's streams) as a server that has seen load has."""
    import threading

    def client() -> None:
        call = http_infer(build, port)
        for _ in range(-(-n // clients)):
            call()
        call.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run(build: Path, first: str, second: str, requests: int, hint: str, seed: int, bursts: int = 0) -> float:
    """Median over request pairs of (second tree's latency - first tree's), in ms; prints the run."""
    args = ("--performance-hint", hint, "--grpc-port", "0", "--metrics-port", "0")
    with (
        server(build, *args, env={"PYTHONPATH": first}) as port_a,
        server(build, *args, env={"PYTHONPATH": second}) as port_b,
    ):
        calls = {"a": http_infer(build, port_a), "b": http_infer(build, port_b)}
        for port in (port_a, port_b) if bursts else ():
            burst(build, port, bursts)
        for _ in range(30):  # warm both: connections, every code path, the model
            calls["a"]()
            calls["b"]()
        rng = random.Random(seed)
        diffs, a_ms, b_ms = [], [], []
        for _ in range(requests):
            order = ("a", "b") if rng.random() < 0.5 else ("b", "a")
            got = {k: calls[k]() for k in order}
            a_ms.append(got["a"])
            b_ms.append(got["b"])
            diffs.append(got["b"] - got["a"])
        for c in calls.values():
            c.close()
    d, lo, hi = median_ci(diffs)
    print(
        f"  first {first}: p50 {statistics.median(a_ms):.3f} ms; second {second}: p50 "
        f"{statistics.median(b_ms):.3f} ms; second - first {d:+.3f} ms (95 % {lo:+.3f}..{hi:+.3f})",
        flush=True,
    )
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the tree to compare against (e.g. a git worktree of HEAD)")
    ap.add_argument("--new", default=str(Path(__file__).resolve().parent.parent), help="default: this tree")
    ap.add_argument("--build-dir", default=None, help="default: a fresh build of --model")
    ap.add_argument("--model", default="vit-tiny")
    ap.add_argument("--hint", default="LATENCY", help="--performance-hint of both servers")
    ap.add_argument("--requests", type=int, default=600, help="request pairs per run")
    ap.add_argument("--runs", type=int, default=4, help="runs, the order of the two servers alternating")
    ap.add_argument(
        "--burst",
        type=int,
        default=0,
        help="first send each server this many requests from 4 concurrent clients (a server that has seen load)",
    )
    args = ap.parse_args()
    old, new = str(Path(args.old).resolve()), str(Path(args.new).resolve())
    with build_dir(args.build_dir, args.model) as build:
        print(
            f"{build.name}: {args.runs} runs of {args.requests} request pairs, 1 client, --performance-hint {args.hint}"
        )
        new_second, new_first = [], []
        for i in range(args.runs):
            if i % 2 == 0:
                new_second.append(run(build, old, new, args.requests, args.hint, i, args.burst))
            else:
                new_first.append(run(build, new, old, args.requests, args.hint, i, args.burst))
    # old first: d = new - old + bias; new first: d = old - new + bias
    net = (
        (statistics.mean(new_second) - statistics.mean(new_first)) / 2
        if new_first
        else statistics.mean(new_second)
    )
    bias = (statistics.mean(new_second) + statistics.mean(new_first)) / 2 if new_first else float("nan")
    print(f"new - old: {net:+.3f} ms per request (the second-started server's own advantage: {bias:+.3f} ms)")


if __name__ == "__main__":
    sys.exit(main())

"""Where one client's time goes: the ``pairs`` and ``cells`` subcommands of ``bench/serve.py`` (each
one's docstring is its ``--help``; ``floor``, the machine's own floors, is in ``floor.py``).

On a shared machine whose speed drifts 10-15 % within the hour (and by milliseconds between minutes on a
17 ms model), a raw measurement and a served one taken minutes apart compare the drift more than the
server: ``pairs`` and ``cells`` measure so that the drift cancels.
Loopback only, bounded in requests.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path

import clients
import harness as h
import raw_ov
import report

ARMS = ("raw", "raw-static", "runtime", "http", "http-shm", "tritonclient", "old", "new")


def cmd_pairs(args) -> None:
    """One client alternates single requests between ``--arms``, in a random order per round:
    raw (a LATENCY compile of the served IR, sync, in this process: the 1-client target's reference),
    raw-static (its batch axis fixed at 1, as ADAPTIVE serves a lone sample), runtime (Runtime.submit in
    this process, no batching window), http (`veo-edge serve` through http.client, a binary request as
    perf_analyzer sends it), http-shm (the same server, a JSON request naming system shared-memory
    regions, as perf_analyzer's --shared-memory system sends it), tritonclient (the same server through tritonclient), old and new (one
    server per tree, --old and --new). Reported per run: each arm's percentiles and, for every two arms,
    the median of the paired differences with a bootstrap 95 % interval. The servers start in the arms'
    order, reversed every other run: the net effect is the mean of the two orders' means, half their
    difference the start order's own effect (the server started second answered 0.1-0.3 ms faster in
    an A/A run)."""
    arms = [a.strip() for a in (args.arms or ("old,new" if args.old else "raw,raw-static,http")).split(",")]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or ({"old", "new"} & set(arms) and not args.old):
        raise SystemExit(f"unknown arms {unknown}; choose from {', '.join(ARMS)} (old and new need --old)")
    per_run = report.Table("per run", {"run": ("run", "{}"), "arm": ("arm", "{}"), **_PCT})
    diffs = report.Table("paired differences", {"run": ("run", "{}"), "pair": ("pair", "{}"), **_DIFF})
    with h.build_dir(args.build_dir, args.model) as build:
        print(f"{build.name}: {args.runs} runs of {args.requests} rounds, --performance-hint {args.hint}")
        for run in range(args.runs):
            ms = _pairs_run(args, build, arms[:: -1 if run % 2 else 1], run)
            for arm in arms:
                per_run.add(
                    run=run + 1, arm=arm, **{f"{k}_ms": v for k, v in report.percentiles(ms[arm]).items()}
                )
            for i, a in enumerate(arms):
                for b in arms[i + 1 :]:
                    d, lo, hi = report.median_ci([y - x for x, y in zip(ms[a], ms[b], strict=True)], run)
                    diffs.add(run=run + 1, pair=f"{b} − {a}", median_ms=d, low_ms=lo, high_ms=hi)
                    print(f"  run {run + 1}: {b} − {a} {d:+.3f} ms (95 % {lo:+.3f}..{hi:+.3f})", flush=True)
    net = report.Table(
        "over runs",
        {
            "pair": ("pair", "{}"),
            "net_ms": ("net ms", "{:+.3f}"),
            "order_ms": ("start order's own effect ms", "{:+.3f}"),
        },
    )
    for pair in dict.fromkeys(r["pair"] for r in diffs.rows):
        ds = [r["median_ms"] for r in diffs.rows if r["pair"] == pair]
        even, odd = ds[0::2], ds[1::2]
        if odd:
            net.add(
                pair=pair,
                net_ms=(statistics.mean(even) + statistics.mean(odd)) / 2,
                order_ms=(statistics.mean(even) - statistics.mean(odd)) / 2,
            )
        else:
            net.add(pair=pair, net_ms=statistics.mean(even))
    report.emit([per_run, diffs, net], args.json)


_PCT = {f"{q}_ms": (f"{q} ms", "{:.3f}") for q in ("p50", "p90", "p99", "mean")}
_DIFF = {
    "median_ms": ("median ms", "{:+.3f}"),
    "low_ms": ("95 % low", "{:+.3f}"),
    "high_ms": ("95 % high", "{:+.3f}"),
}


def _pairs_run(args, build: Path, order: list[str], seed: int) -> dict[str, list[float]]:
    """One run: the arms made in ``order`` (servers started in it), ``--requests`` rounds; ms per arm."""
    from veo_edge.builddir import BuildDir

    _, xml = raw_ov.served_ir(build)
    x, name = h.sample(build, 1), BuildDir.open(build).model_name
    serve = ("--performance-hint", args.hint)
    calls: dict = {}
    ports = []  # the servers, to burst once all are up
    with contextlib.ExitStack() as stack:
        for arm in order:
            if arm.startswith("raw"):
                request = raw_ov.sync_request(xml, static=arm == "raw-static")
                calls[arm] = lambda r=request: r.infer(x)
            elif arm == "runtime":
                import veo_edge

                rt = stack.enter_context(
                    veo_edge.Runtime(build, max_queue_delay_ms=0.0, performance_hint=args.hint)
                )
                calls[arm] = lambda rt=rt: rt.submit(x[0]).result(timeout=60)
            elif arm in ("http", "http-shm", "tritonclient") and "srv" not in calls:
                calls["srv"] = stack.enter_context(h.server(build, *serve, "--shared-memory"))
            elif arm in ("old", "new"):
                srv = stack.enter_context(
                    h.server(build, *serve, tree=args.old if arm == "old" else args.new)
                )
                calls[arm] = stack.enter_context(contextlib.closing(clients.HttpCall.infer(build, srv.http)))
                ports.append(srv.http)
        if srv := calls.pop("srv", None):
            make = {
                "http": lambda: clients.HttpCall.infer(build, srv.http),
                "http-shm": lambda: clients.HttpCall.infer_shm(build, srv.http),
                "tritonclient": lambda: clients.TritonCall("http", srv.http, name, x),
            }
            for arm in [a for a in make if a in order]:
                calls[arm] = stack.enter_context(contextlib.closing(make[arm]()))
            ports.append(srv.http)
        for port in ports if args.burst else ():
            clients.closed_loop(
                lambda i, p=port: clients.HttpCall.infer(build, p), 4, 600.0, -(-args.burst // 4), warmup_s=0
            )
        return clients.paired(calls, args.requests, seed)


def cmd_cells(args) -> None:
    """Pairs of cells: a raw sync cell (LATENCY compile, batch 1, in this process), then at once a
    perf_analyzer cell at 1 client against each server (one per --hint; --old: that tree's too). Per
    server: the median over pairs of its p50 minus the pair's raw p50, and its own split of a request
    (queue and compute from /v2/models/NAME/stats; the rest is HTTP, parsing and the client)."""
    from veo_edge.builddir import BuildDir

    hints = [s.strip().upper() for s in args.hint.split(",") if s.strip()]
    with h.build_dir(args.build_dir, args.model) as build, contextlib.ExitStack() as stack:
        precision, xml = raw_ov.served_ir(build)
        x, name = h.sample(build, 1), BuildDir.open(build).model_name
        request = raw_ov.sync_request(xml)  # compiled once: every pair's raw cell runs it
        shm = ("--shared-memory",) if args.transport.endswith("-shm") else ()
        servers = {
            s.lower(): stack.enter_context(h.server(build, "--performance-hint", s, *shm)) for s in hints
        }
        if args.old:
            servers[f"old {hints[0].lower()}"] = stack.enter_context(
                h.server(build, "--performance-hint", hints[0], *shm, tree=args.old)
            )
        print(
            f"{name} ({precision} IR), 1 client over {args.transport}, {args.pairs} pairs of {args.seconds:g} s"
        )
        raws: list[float] = []
        rows: dict[str, list[tuple[float, float, float]]] = {s: [] for s in servers}  # p50, queue, compute
        for i in range(args.pairs):
            raws.append(raw_ov.time_sync(request, x, args.seconds)["p50"])
            line = [f"pair {i + 1}: raw {raws[-1]:6.2f}"]
            for who, srv in servers.items():
                before = h.model_stats(srv.http, name)["inference_stats"]
                r = clients.perf_analyzer(
                    args.perf_analyzer, name, srv.port(args.transport), args.transport, 1, args.seconds
                )
                after = h.model_stats(srv.http, name)["inference_stats"]
                n = max(1, after["success"]["count"] - before["success"]["count"])
                queue, compute = (
                    (after[k]["ns"] - before[k]["ns"]) / n / 1e6 for k in ("queue", "compute_infer")
                )
                rows[who].append((r["p50"], queue, compute))
                line.append(f"{who} {r['p50']:6.2f} ({r['p50'] - raws[-1]:+5.2f})")
            print("  ".join(line), flush=True)
    table = report.Table(
        f"one client: served p50 minus raw sync (raw sync p50 {statistics.median(raws):.2f} ms, "
        f"{min(raws):.2f}-{max(raws):.2f})",
        {
            "server": ("server", "{}"),
            "minus_raw_ms": ("p50 − raw ms", "{:+.2f}"),
            "range": ("range", "{}"),
            "queue_ms": ("queue ms", "{:.2f}"),
            "compute_ms": ("compute − raw ms", "{:+.2f}"),
            "rest_ms": ("rest ms", "{:.2f}"),
        },
    )
    for who, rs in rows.items():
        d = [p - raw for (p, _, _), raw in zip(rs, raws, strict=True)]
        table.add(
            server=who,
            minus_raw_ms=statistics.median(d),
            range=f"{min(d):+.2f}..{max(d):+.2f}",
            queue_ms=statistics.median(q for _, q, _ in rs),
            compute_ms=statistics.median(c - raw for (_, _, c), raw in zip(rs, raws, strict=True)),
            rest_ms=statistics.median(p - q - c for p, q, c in rs),
        )
    report.emit([table], args.json, raw_sync_ms=raws)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = h.command(
        sub, "pairs", cmd_pairs, "one client, arms interleaved request by request (raw, served, two trees)"
    )
    h.build_args(p, "vit-tiny")
    p.add_argument(
        "--arms",
        default=None,
        help=f"comma-separated, from {', '.join(ARMS)} (none: raw,raw-static,http; with --old: old,new)",
    )
    p.add_argument("--old", default=None, help="a tree to compare against (e.g. a git worktree of main)")
    p.add_argument("--new", default=str(report.TREE), help="the other tree (this one)")
    p.add_argument("--hint", default="ADAPTIVE", help="--performance-hint of the servers and the runtime")
    p.add_argument("--requests", type=int, default=400, help="rounds (one request per arm) per run")
    p.add_argument(
        "--runs", type=int, default=2, help="runs, each with fresh servers, start order alternating"
    )
    p.add_argument("--burst", type=int, default=0, help="first send each server this many from 4 clients")
    p = h.command(sub, "cells", cmd_cells, "one client: raw sync cells and perf_analyzer cells, in pairs")
    h.build_args(p, "vit-tiny")
    p.add_argument("--perf-analyzer", required=True, help="Triton's perf_analyzer binary")
    p.add_argument("--hint", default="ADAPTIVE,LATENCY", help="one server per --performance-hint")
    p.add_argument("--old", default=None, help="also serve this tree's code (the first hint)")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=2.0, help="per cell")
    p.add_argument("--transport", default="http", choices=("http", "grpc", "http-shm", "grpc-shm"))

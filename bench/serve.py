"""`veo-edge serve` benches, on loopback, bounded in time; one subcommand per question:

    python bench/serve.py limit   # raw OpenVINO (sync, kept full) against the server over HTTP/gRPC, and Triton
    python bench/serve.py load    # K closed-loop clients per server or tree: throughput, latency, batch, CPU
    python bench/serve.py faults  # the transient-fault schedule: errors (must be 0) and p99, with and without
    python bench/serve.py images  # JPEG pictures (BYTES, decoded by the server) against f32 tensors
    python bench/serve.py pairs   # one client, arms interleaved request by request (raw, in-process, served,
                                  # two trees), medians of the paired differences with bootstrap intervals
    python bench/serve.py cells   # one client, a raw sync cell then a perf_analyzer cell per server, in pairs
    python bench/serve.py floor   # the machine's own cost of a thread hand-off and of a loopback body
    python bench/serve.py trace   # one client; each request's parts stamped in the server (--old TREE: A/B)

``python bench/serve.py SUBCOMMAND --help`` tells each one's options; every one prints its results as
markdown tables and writes them as JSON with ``--json PATH`` (``bench/plot.py`` draws them). The machine
may be shared: check ``uptime`` first and read the numbers as noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import clients
import floor
import harness as h
import one_client
import raw_ov
import report
import serve_images
import trace_server

SERVED = {
    "who": ("", "{}"),
    "transport": ("transport", "{}"),
    "path": ("path", "{}"),
    "clients": ("clients", "{}"),
    "samples_s": ("samples/s", "{:.1f}"),
    "p50_ms": ("p50 ms", "{:.2f}"),
    "p90_ms": ("p90 ms", "{:.2f}"),
    "p99_ms": ("p99 ms", "{:.2f}"),
    "errors": ("errors", "{}"),
    "batch": ("mean batch", "{:.2f}"),
    "cpu_ms": ("server CPU ms/req", "{:.2f}"),
    "client_cpu_ms": ("client CPU ms/req", "{:.2f}"),
    "rounds": ("samples/s each round", "{}"),
}


def cell_args(ap: argparse.ArgumentParser, **defaults) -> None:
    """The options of the commands that drive servers with K clients (``limit``, ``load``); ``defaults``
    are each command's."""
    h.build_args(ap, defaults["model"])
    ap.add_argument("--concurrency", help="client counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=5.0, help="per cell")
    ap.add_argument("--requests", type=int, default=None, help="or at most this many requests per client")
    ap.add_argument("--rounds", type=int, help="cells interleaved this many times")
    ap.add_argument("--batch", type=int, default=1, help="samples per request")
    ap.add_argument(
        "--hint", default="ADAPTIVE", help="the servers' --performance-hint; several, comma-separated"
    )
    ap.add_argument(
        "--transports", help="http, grpc, http-shm, grpc-shm (system shared memory), comma-separated"
    )
    ap.add_argument(
        "--client", default="tritonclient", choices=("tritonclient", "http"), help="http: http.client"
    )
    ap.add_argument("--path", default="infer", help="infer, live (GET /v2/health/live: HTTP only, no model)")
    ap.add_argument("--perf-analyzer", default=None, help="drive the servers with this perf_analyzer binary")
    ap.add_argument(
        "--tree", action="append", default=[], help="also serve this checkout's code (repeatable)"
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="also serve the build with these options added, e.g. '--batch-limit 1' (repeatable; named by them)",
    )
    ap.add_argument("--pytriton", default=None, help="a Python with nvidia-pytriton: Triton's rows too")
    ap.add_argument("--server-args", default="--max-queue 4096", help="more `veo-edge serve` options")
    ap.add_argument("--settle", type=float, default=0.0, help="seconds to wait once the servers are up")
    ap.set_defaults(**defaults)


def served_cells(args, build: Path, stack: contextlib.ExitStack, before_round=None) -> report.Table:
    """Start the servers (one per hint, one per --tree, Triton), drive every (server, transport, path,
    clients) cell ``--rounds`` times interleaved; the table of medians (latencies pooled over rounds)."""
    from veo_edge.builddir import BuildDir

    name, x = BuildDir.open(build).model_name, h.sample(build, args.batch)
    hints = [s.strip().upper() for s in args.hint.split(",") if s.strip()]
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    extra = shlex.split(args.server_args) + (
        ["--shared-memory"] if any("-shm" in t for t in transports) else []
    )
    servers = {(hint.lower() if len(hints) > 1 else "serve"): ("--performance-hint", hint) for hint in hints}
    servers = {who: stack.enter_context(h.server(build, *a, *extra)) for who, a in servers.items()}
    for variant in args.variant:
        servers[variant] = stack.enter_context(h.server(build, *extra, *shlex.split(variant)))
    for i, tree in enumerate(args.tree):
        servers[f"tree{i + 1}" if len(args.tree) > 1 else "base"] = stack.enter_context(
            h.server(build, *shlex.split(args.server_args), tree=tree)  # no shm cells: older trees lack it
        )
    triton = stack.enter_context(h.pytriton(args.pytriton, build))
    if triton:
        servers["triton"] = triton
    paths = [p.strip() for p in args.path.split(",")]
    targets = [
        (w, t, p) for w in servers for t in transports for p in paths if not (w == "base" and "-shm" in t)
    ]
    levels = [int(c) for c in args.concurrency.split(",")]
    time.sleep(args.settle)  # e.g. until the servers' start-up work (the JSON decoder process) is done
    cells: dict[tuple, list[dict]] = {}
    for i in range(args.rounds):
        if before_round:
            before_round(i)
        for k in levels:
            for who, transport, path in targets:
                srv = servers[who]
                cpu, stats = h.cpu_seconds(srv.pid), path == "infer" and h.model_stats(srv.http, name)
                r = _cell(args, build, name, x, srv.port(transport), transport, path, k)
                sent = r.get("sent")  # every request of the cell, warm-up included, as the CPU time
                if stats:
                    after = h.model_stats(srv.http, name)
                    r["inferences"] = int(after["inference_count"]) - int(stats["inference_count"])
                    r["executions"] = int(after["execution_count"]) - int(stats["execution_count"])
                    sent = _count(after) - _count(stats)
                if sent and srv.pid:  # the server's CPU per request: robust to a busy machine, unlike latency
                    r["cpu_ms"] = (h.cpu_seconds(srv.pid) - cpu) * 1e3 / sent
                if sent and "client_cpu_s" in r:  # perf_analyzer's: the machine's share the server lacked
                    r["client_cpu_ms"] = r["client_cpu_s"] * 1e3 / sent
                cells.setdefault((who, transport, path, k), []).append(r)
    table = report.Table("served", {k: v for k, v in SERVED.items() if k != "path" or len(paths) > 1})
    for (who, transport, path, k), rs in cells.items():
        pct = report.percentiles([v for r in rs for v in r["lat"]]) if "lat" in rs[0] else None
        pct = pct or {q: report.median(r[q] for r in rs) for q in ("p50", "p90", "p99")}
        execs = sum(r.get("executions", 0) for r in rs)
        scale = args.batch if path == "infer" else 1  # requests/s -> samples/s
        table.add(
            who=who,
            transport=transport,
            path=path,
            clients=k,
            samples_s=report.median(r["rate"] for r in rs) * scale,
            p50_ms=pct["p50"],
            p90_ms=pct.get("p90"),
            p99_ms=pct["p99"],
            errors=sum(r["errors"] for r in rs),
            batch=sum(r.get("inferences", 0) for r in rs) / execs if execs else None,
            cpu_ms=report.median(r["cpu_ms"] for r in rs) if "cpu_ms" in rs[0] else None,
            client_cpu_ms=report.median(r["client_cpu_ms"] for r in rs) if "client_cpu_ms" in rs[0] else None,
            # the spread between rounds shows how far the machine moved: a difference inside it is noise
            rounds=", ".join(f"{r['rate'] * scale:.1f}" for r in rs) if len(rs) > 1 else None,
        )
    return table


def _count(stats: dict) -> int:
    return int(stats["inference_stats"]["success"]["count"])


def _cell(args, build: Path, name: str, x, port: int, transport: str, path: str, k: int) -> dict:
    if path == "live":
        if not transport.startswith("http"):
            raise SystemExit("--path live is HTTP only: give --transports http")
        make = lambda i: clients.HttpCall(port, "GET", "/v2/health/live")  # noqa: E731
    elif args.perf_analyzer:
        return clients.perf_analyzer(args.perf_analyzer, name, port, transport, k, args.seconds)
    elif args.client == "http":
        make = lambda i: clients.HttpCall.infer(build, port, args.batch)  # noqa: E731
    else:
        make = lambda i: clients.TritonCall(transport, port, name, x, str(i))  # noqa: E731
    return clients.closed_loop(make, k, args.seconds, args.requests)


def cmd_load(args) -> None:
    """Servers on one build: one ``veo-edge serve`` per ``--hint``, one per ``--tree`` (another checkout's
    code, e.g. before a change), Triton with ``--pytriton``. Per (server, transport, path, clients) cell:
    samples/s, latency percentiles, errors, the server's mean executed batch (from its statistics) and its
    CPU time per request (user + system, every thread: a busy machine disturbs it far less than latency).
    Clients: ``--client tritonclient`` (threads, binary tensors; ``-shm`` transports: the tensors in system
    shared memory), ``--client http`` (one kept-alive ``http.client`` connection each, the request as
    perf_analyzer sends it; ``--path live`` sends ``GET /v2/health/live``: the HTTP layer alone), or
    ``--perf-analyzer PATH``. Each client waits 0.5 s unmeasured, then runs ``--seconds`` (or
    ``--requests``); cells interleave ``--rounds`` times: throughput is the median over rounds, latency
    percentiles pool the rounds."""
    with h.build_dir(args.build_dir, args.model) as build, contextlib.ExitStack() as stack:
        print(
            f"load {report.machine()['load_1min']}; {build.name}, batch {args.batch} per request",
            file=sys.stderr,
        )
        table = served_cells(args, build, stack)
    report.emit([table], args.json)


def cmd_limit(args) -> None:
    """``load``'s cells (on vit-tiny, batch 1) against the machine's limit, on the IR the build serves (f32,
    or its int8 IR; the compiles state f32; Triton runs the build's f32 IR):

    - raw sync b1: one LATENCY-compiled infer request, batch 1, back to back (what one client can get);
    - raw limit bN: an AsyncInferQueue on a THROUGHPUT compile (OpenVINO's streams and optimal number of
      infer requests) kept full at batch N = 1, 2, 4, 8; the best batch is the limit;
    - static: the same two with the batch axis fixed at 1 before compiling, as ADAPTIVE serves a sample,
      the limit with two infer requests per stream (one queued behind each running one).

    The raw rows are measured again before every round (the machine drifts 10-15 % within the hour), the
    median over rounds used. Each served row gets its share of both limits and its p50 minus both syncs;
    with ``--perf-analyzer``, also its share of the limit scaled to the CPU the client left the server
    (perf_analyzer runs on the same machine; the raw limit had every CPU); with ``--pytriton``, its
    throughput over Triton's."""
    from veo_edge.builddir import BuildDir

    with h.build_dir(args.build_dir, args.model) as build, contextlib.ExitStack() as stack:
        precision, xml = raw_ov.served_ir(build)
        x, max_batch = h.sample(build, 1), BuildDir.open(build).max_batch
        print(f"{build.name} ({precision} IR), {args.seconds:g} s cells", file=sys.stderr)
        by_batch = {
            b: raw_ov.raw_limit(xml, x, b, args.seconds)["rate"] for b in (1, 2, 4, 8) if b <= max_batch
        }
        best = max(by_batch, key=by_batch.__getitem__)
        raw: dict[str, list[tuple[float, float | None]]] = {}

        def measure(i: int) -> None:  # the machine drifts: the raw rows again before every round
            for label, static in (("raw sync b1", False), ("raw sync b1 static", True)):
                r = raw_ov.time_sync(raw_ov.sync_request(xml, static), x, args.seconds)
                raw.setdefault(label, []).append((r["rate"], r["p50"]))
            rate = by_batch[best] if i == 0 else raw_ov.raw_limit(xml, x, best, args.seconds)["rate"]
            raw.setdefault(f"raw limit b{best}", []).append((rate, None))
            rate = raw_ov.raw_limit(xml, x, 1, args.seconds, static=True)["rate"]
            raw.setdefault("raw limit static b1", []).append((rate, None))

        served = served_cells(args, build, stack, measure)
    columns = {"row": ("", "{}"), "samples_s": ("samples/s", "{:.1f}"), "p50_ms": ("p50 ms", "{:.2f}")}
    rows = report.Table("raw", columns | {"rounds": ("each round", "{}")})
    for b, rate in by_batch.items():
        rows.add(row=f"raw limit b{b} (round 1)", samples_s=rate)
    for label, rs in raw.items():
        sync = rs[0][1] is not None
        each = ", ".join(f"{p:.2f}" if sync else f"{r:.1f}" for r, p in rs)
        p50 = report.median(p for _, p in rs) if sync else None
        rows.add(row=label, samples_s=report.median(r for r, _ in rs), p50_ms=p50, rounds=each)
    med = {r["row"]: r for r in rows.rows}
    limit, static = med[f"raw limit b{best}"]["samples_s"], med["raw limit static b1"]["samples_s"]
    sync, static_sync = med["raw sync b1"]["p50_ms"], med["raw sync b1 static"]["p50_ms"]
    served.columns |= {
        "of_limit": ("of limit", "{:.0%}"),
        "of_static": ("of static", "{:.0%}"),
        "sync_ms": ("p50 − sync", "{:+.2f}"),
        "static_ms": ("− static sync", "{:+.2f}"),
    }
    if any(r.get("client_cpu_ms") for r in served.rows):
        served.columns["of_left"] = ("of limit × CPU left by client", "{:.0%}")
    cpus = len(os.sched_getaffinity(0))
    for r in served.rows:
        r.update(of_limit=r["samples_s"] / limit, of_static=r["samples_s"] / static)
        if r.get("client_cpu_ms"):  # the limit had every CPU; the server had what the client left it
            client_share = r["client_cpu_ms"] * r["samples_s"] / args.batch / 1e3 / cpus
            r.update(of_left=r["of_limit"] / (1 - client_share))
        r.update(sync_ms=r["p50_ms"] - sync, static_ms=r["p50_ms"] - static_sync)
    tables = [rows, served]
    if args.pytriton:
        rates = {(r["who"], r["transport"], r["clients"]): r["samples_s"] for r in served.rows}
        columns = {"who": ("", "{}"), "transport": ("transport", "{}"), "clients": ("clients", "{}")}
        ratio = report.Table("against Triton", columns | {"x": ("/ Triton", "{:.2f}×")})
        for (who, t, k), rate in rates.items():
            if who != "triton" and who != "base" and not who.startswith("tree"):
                ratio.add(who=who, transport=t, clients=k, x=rate / rates["triton", t, k])
        tables.append(ratio)
    report.emit(tables, args.json)


def cmd_faults(args) -> None:
    """Two servers on one build, with VEO_EDGE_FAULTS=--faults and without, in ``--rounds`` interleaved
    rounds (a fresh server each); clients send back to back. A row per run sums its rounds: requests and
    errors, p50/p99 over every latency, what /metrics counted (summed), and each round's p99."""
    json.loads(args.faults)
    table = report.Table(
        "faults",
        {
            "run": ("run", "{}"),
            "requests": ("requests", "{}"),
            "errors": ("errors", "{}"),
            "p50_ms": ("p50 ms", "{:.2f}"),
            "p99_ms": ("p99 ms", "{:.2f}"),
            "p99_rounds": ("p99 ms each round", "{}"),
            "faults": ("faults", "{}"),
            "retries": ("retries", "{}"),
            "switches": ("switches", "{}"),
            "active": ("active", "{}"),
            "standby": ("standby", "{}"),
        },
    )
    runs = {"faults": {"VEO_EDGE_FAULTS": args.faults}, "no faults": {"VEO_EDGE_FAULTS": ""}}
    seen: dict[str, list[tuple[dict, dict]]] = {label: [] for label in runs}
    with h.build_dir(args.build_dir, args.model) as build:
        for _ in range(args.rounds):
            for label, env in runs.items():
                with h.server(build, env=env) as srv:
                    r = clients.closed_loop(
                        lambda i: clients.HttpCall.infer(build, srv.http),
                        args.clients,
                        args.seconds,
                        warmup_s=0,
                    )
                    seen[label].append((r, _fault_metrics(srv.http)))
    for label, rounds in seen.items():
        lat = [ms for r, _ in rounds for ms in r["lat"]]
        codes: Counter[str] = Counter()
        for r, _ in rounds:
            codes.update(r["codes"])  # update, unlike +, keeps zero counts
        counted = _summed([m for _, m in rounds])
        pct = report.percentiles(lat)
        table.add(
            run=label,
            requests=sum(codes.values()),
            errors=sum(r["errors"] for r, _ in rounds),
            codes=codes,
            p50_ms=pct["p50"],
            p99_ms=pct["p99"],
            p99_rounds=", ".join(f"{report.percentiles(r['lat'])['p99']:.1f}" for r, _ in rounds),
            **counted,
        )
    report.emit([table], args.json)


def _summed(rounds: list[dict]) -> dict:
    """The /metrics readings of several servers (:func:`_fault_metrics`), counters summed; the active and
    standby backends of each round, joined where they differ."""
    out: dict = {"switches": sum(m["switches"] for m in rounds)}
    for k in ("faults", "retries"):
        total: Counter[str] = Counter()
        for m in rounds:
            total.update(m[k])
        out[k] = ", ".join(f"{label} {n}" for label, n in sorted(total.items())) or "-"
    for k in ("active", "standby"):
        out[k] = "/".join(dict.fromkeys(str(m[k]) for m in rounds))
    return out


def _fault_metrics(port: int) -> dict:
    """What the server's /metrics counted: faults and retries (``"backend kind"`` / ``"backend outcome"``:
    count), switches, the active and standby backends."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict = {"faults": {}, "retries": {}, "switches": 0, "active": None, "standby": None}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            b = s.labels.get("backend")
            if s.name == "veo_edge_backend_faults_total":
                out["faults"][f"{b} {s.labels['kind']}"] = int(s.value)
            elif s.name == "veo_edge_retries_total":
                out["retries"][f"{b} {s.labels['outcome']}"] = int(s.value)
            elif s.name == "veo_edge_fallback_switches_total":
                out["switches"] = int(s.value)
            elif s.name in ("veo_edge_active_backend", "veo_edge_standby_backend") and s.value == 1:
                out[s.name.split("_")[2]] = b
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = h.command(sub, "limit", cmd_limit, "raw OpenVINO against the server over HTTP and gRPC, and Triton")
    cell_args(p, model="vit-tiny", concurrency="1,2,4,8", rounds=2, transports="http,grpc")
    p = h.command(sub, "load", cmd_load, "K clients per server (tritonclient, http.client or perf_analyzer)")
    cell_args(p, model="vit-nano", concurrency="1,8,32", rounds=1, transports="http")
    p = h.command(sub, "faults", cmd_faults, "the transient-fault schedule: errors (must be 0) and p99")
    h.build_args(p, "vit-nano")
    p.add_argument("--faults", default='{"*": {"every_nth": 7}}', help="VEO_EDGE_FAULTS of the first run")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=1, help="rounds, the two servers interleaved in each")
    serve_images.add_command(sub)
    one_client.add_commands(sub)
    floor.add_command(sub)
    trace_server.add_command(sub)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still stops its servers
    t = time.perf_counter()
    args.run(args)
    print(f"({time.perf_counter() - t:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()

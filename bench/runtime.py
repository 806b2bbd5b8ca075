"""The in-process runtime (``veo_edge.Runtime``, no HTTP), one subcommand per question:

    python bench/runtime.py batching   # dynamic batching by clients and queue delay; a mid-run fallback switch
    python bench/runtime.py warmup     # memory and first calls with and without `Runtime.warm_up`
    python bench/runtime.py precision  # f32 against bf16 and int8 on the CPU (OpenVINO), and vit-digits' top-1
    python bench/runtime.py pays       # whether batching pays on this CPU, per build, and what --batch-limit auto decides

Every one prints markdown tables and writes them as JSON with ``--json PATH``. Timings on a shared machine
are noisy: read the ratios, and rerun.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness as h
import numpy as np
import report
from clients import closed_loop  # `clients` is a client count here

PRECISIONS = ("f32", "bf16", "int8")


def cmd_batching(args) -> None:
    """For each (clients, max queue delay): ``--requests`` single samples from that many threads through
    ``Runtime.submit`` on OpenVINO. Then a CUDA-OOM-like fault injected into ONNX Runtime after 20 batches
    (policy onnxruntime -> openvino): how long the batch that hit it took, the switch included."""
    import veo_edge

    table = report.Table(
        "dynamic batching",
        {
            "clients": ("clients", "{}"),
            "delay_ms": ("max queue delay ms", "{:g}"),
            "rate": ("requests/s", "{:.0f}"),
            "p50_ms": ("p50 ms", "{:.2f}"),
            "p99_ms": ("p99 ms", "{:.2f}"),
            "batch": ("mean batch", "{:.2f}"),
            "wait_ms": ("mean queue wait ms", "{:.2f}"),
        },
    )
    with h.build_dir(args.build_dir, args.model) as build:
        x = h.sample(build, 1)[0]
        for clients in map(int, args.clients.split(",")):
            for delay in map(float, args.delays_ms.split(",")):
                with veo_edge.Runtime(
                    build, backend="openvino", max_queue_delay_ms=delay, max_queue=4096
                ) as rt:
                    rt.submit(x).result(timeout=60)  # warm-up
                    before = rt.stats()

                    def call(rt=rt) -> str:
                        rt.submit(x).result(timeout=60)
                        return "200"

                    r = closed_loop(
                        lambda i: call, clients, 600.0, max(1, args.requests // clients), warmup_s=0
                    )
                    after = rt.stats()
                n = after["requests_success"] - before["requests_success"]
                p = report.percentiles(r["lat"])
                table.add(
                    clients=clients,
                    delay_ms=delay,
                    rate=r["rate"],
                    p50_ms=p["p50"],
                    p99_ms=p["p99"],
                    batch=n / max(after["batches"] - before["batches"], 1),
                    wait_ms=(after["queue_us_total"] - before["queue_us_total"]) / max(n, 1) / 1e3,
                )
        faults = {"onnxruntime": {"oom_after": 20}}
        with veo_edge.Runtime(build, policy=["onnxruntime", "openvino"], faults=faults) as rt:
            times = [report.timed(lambda: rt.infer(x[None])) for _ in range(40)]
            state = rt.state
    switch = report.Table(
        "fallback onnxruntime -> openvino after an injected OOM",
        {
            "switches": ("switches", "{}"),
            "switch_ms": ("the failing batch ms (re-run included)", "{:.1f}"),
            "steady_ms": ("steady ms", "{:.2f}"),
            "active": ("then on", "{}"),
        },
    )
    switch.add(
        switches=state.fallback_count,
        switch_ms=times[20],
        steady_ms=statistics.median(times[25:]),
        active=state.active_backend,
    )
    report.emit([table, switch], args.json)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def warmup_case(build_dir: str, hint: str, warm: bool) -> dict:
    """One case, in this (fresh) process: start, warm or not, then every batch size once alone (4 calls)
    and twice as two concurrent batches."""
    from veo_edge.runtime.runtime import Runtime

    t0 = time.perf_counter()
    rt = Runtime(build_dir, backend="openvino", performance_hint=hint).start()
    start_s = time.perf_counter() - t0
    warmed = rt.warm_up() if warm else None
    ready = _rss_mib()
    x = np.random.default_rng(0).random((rt.max_batch, *rt.input_shape), dtype=np.float32)
    first_excess = 0.0
    for b in range(1, rt.max_batch + 1):
        ts = [report.timed(lambda b=b: rt.infer(x[:b])) for _ in range(4)]
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
        "hint": hint,
        "precision": described["precision"],
        "start_s": start_s,
        "warmup_s": warmed["seconds"] if warmed else None,
        "rss_ready_mib": ready,
        "rss_after_mib": after,
        "infer_requests": described.get("infer_requests"),
        "first_calls_ms": first_excess,
    }


def cmd_warmup(args) -> None:
    """Each case in a fresh process (memory is the process's), cold and warmed in turn, ``--repeat`` times.
    "first calls": the sum over batch sizes of each size's first call minus the median of its later
    ones (on a shared machine this moves by tens of ms either way)."""
    if args.case:
        print(json.dumps(warmup_case(args.build_dir, args.hint, args.case == "warmed")))
        return
    table = report.Table(
        f"the warm-up, {args.hint}",
        {
            "case": ("case", "{}"),
            "precision": ("precision", "{}"),
            "start_s": ("start s", "{:.2f}"),
            "warmup_s": ("warm-up s", "{:.2f}"),
            "rss_ready_mib": ("RSS when ready MiB", "{:.0f}"),
            "rss_after_mib": ("RSS after the traffic MiB", "{:.0f}"),
            "infer_requests": ("infer requests", "{}"),
            "first_calls_ms": ("first calls ms", "{:+.1f}"),
        },
    )
    with h.build_dir(args.build_dir, args.model) as build:
        for _ in range(args.repeat):
            for case in ("cold", "warmed"):
                cmd = [sys.executable, __file__, "warmup", "--build-dir", str(build), "--hint", args.hint]
                out = subprocess.run(
                    [*cmd, "--case", case], capture_output=True, text=True, check=True, timeout=600
                )
                table.add(**json.loads(out.stdout.strip().splitlines()[-1]))
    report.emit([table], args.json)


def precision_build(root: Path, model: str, precision: str, max_batch: int) -> Path:
    """``model`` built at ``--cpu-precision precision`` into ``root`` (reused when there; int8 calibrated
    on 64 seeded inputs, vit-digits on its own training split)."""
    from veo_edge.export.parity import seeded_inputs
    from veo_edge.export.source import BuiltinSource
    from veo_edge.pipeline.build import BuildOptions, run_build

    out = root / f"{model}-{precision}"
    if (out / "manifest.json").is_file():
        return out
    calibration = None
    if precision == "int8" and model != "vit-digits":
        from veo_edge.models import get_config

        calibration = root / f"{model}-calibration.npy"
        np.save(calibration, seeded_inputs(get_config(model).input_shape, 64, 99))
    t = time.perf_counter()
    options = BuildOptions(
        BuiltinSource(model),
        out=out,
        max_batch=max_batch,
        quiet=True,
        plugins=False,
        cpu_precision=precision,
        calibration=calibration,
    )
    run_build(options)
    print(f"built {out} in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return out


def throughput(rt, x: np.ndarray, seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or n < 3:
        rt.infer(x)
        n += 1
    return n * len(x) / elapsed


def cmd_precision(args) -> None:
    """One Runtime per precision, run interleaved (round-robin, order rotated every round) at batch 1 and
    at the max batch, ``--seconds`` a turn: the median samples/s, and the ratios to f32."""
    import veo_edge
    from veo_edge.export.accuracy import top1_points
    from veo_edge.export.parity import seeded_inputs

    table = report.Table(
        "CPU precision",
        {
            "model": ("model", "{}"),
            "batch": ("batch", "{}"),
            **{f"{p}_s": (f"{p} samples/s", "{:.1f}") for p in PRECISIONS},
            "bf16_x": ("bf16 / f32", "{:.2f}×"),
            "int8_x": ("int8 / f32", "{:.2f}×"),
            "top1": ("top-1 on the 540 test scans", "{}"),
        },
    )
    for model in args.models.split(","):
        paths = {p: precision_build(args.builds, model, p, args.max_batch) for p in PRECISIONS}
        runtimes = {p: veo_edge.Runtime(paths[p], backend="openvino").start() for p in PRECISIONS}
        try:
            top1 = None
            if model == "vit-digits":
                from veo_edge.models.digits import test_split

                test = test_split()
                acc = {p: top1_points(runtimes[p].infer(test.x), test.y) for p in PRECISIONS}
                top1 = ", ".join(f"{p} {v:.2f} %" for p, v in acc.items())
            for batch in sorted({1, args.max_batch}):
                x = seeded_inputs(runtimes["f32"].input_shape, batch, 3)
                for p in PRECISIONS:
                    runtimes[p].infer(x)  # warm-up: infer requests and buffers for this batch size
                rates: dict[str, list[float]] = {p: [] for p in PRECISIONS}
                for r in range(args.rounds):
                    for p in PRECISIONS[r % 3 :] + PRECISIONS[: r % 3]:
                        rates[p].append(throughput(runtimes[p], x, args.seconds))
                med = {p: statistics.median(v) for p, v in rates.items()}
                table.add(
                    model=model,
                    batch=batch,
                    **{f"{p}_s": med[p] for p in PRECISIONS},
                    bf16_x=med["bf16"] / med["f32"],
                    int8_x=med["int8"] / med["f32"],
                    spread={p: (min(v), max(v)) for p, v in rates.items()},
                    served={p: runtimes[p].describe()["precision"] for p in PRECISIONS},
                    top1=top1 if batch == 1 else None,
                )
        finally:
            for rt in runtimes.values():
                rt.close()
    report.emit([table], args.json)


def cmd_pays(args) -> None:
    """Per build, OpenVINO's THROUGHPUT compiles kept full at f32 with two infer requests per stream (as
    ADAPTIVE serves): the batch-1 static compile against the dynamic one at batches 2, 4 and 8 (rounds
    interleaved, medians; the batch-1 LATENCY sync p50 for scale), then what ``--batch-limit auto``
    decides in ``--starts`` fresh activations of the runner (its own short windows, ratio -> limit)."""
    import raw_ov

    from veo_edge.builddir import BuildDir
    from veo_edge.runtime.backends.openvino import OpenVinoRunner

    columns = {
        "build": ("build", "{}"),
        "sync_ms": ("sync b1 ms", "{:.2f}"),
        "b1": ("b1 samples/s", "{:.1f}"),
    }
    columns |= {f"b{b}": (f"b{b} / b1", "{:.2f}") for b in (2, 4, 8)} | {
        "auto": ("auto: ratio -> limit", "{}")
    }
    table = report.Table("does batching pay (OpenVINO f32, THROUGHPUT, 2 requests per stream)", columns)
    for path in map(Path, args.builds.split(",")):
        _, xml = raw_ov.served_ir(path)
        x, top = h.sample(path, 1), BuildDir.open(path).max_batch
        single, dynamic = raw_ov.compile_ir(xml, "THROUGHPUT", True), raw_ov.compile_ir(xml, "THROUGHPUT")
        jobs = 2 * int(single.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        sync = raw_ov.time_sync(raw_ov.sync_request(xml, True), x, args.seconds)["p50"]
        rates: dict[int, list[float]] = {b: [] for b in (1, 2, 4, 8) if b <= top}
        for _ in range(args.rounds):
            for b, got in rates.items():
                x_b = np.ascontiguousarray(np.repeat(x, b, 0))
                got.append(raw_ov.keep_full(single if b == 1 else dynamic, x_b, args.seconds, jobs)["rate"])
        med = {b: statistics.median(v) for b, v in rates.items()}
        decided = []
        for _ in range(args.starts):
            with OpenVinoRunner(xml, max_batch=top, hint="ADAPTIVE", measure_batching=True) as runner:
                m = runner.measured
                decided.append(f"{m.ratio:.2f} -> {runner.max_batch}" if m else "not measured")
        row = {f"b{b}": med[b] / med[1] for b in med if b > 1}
        table.add(build=path.name, sync_ms=sync, b1=med[1], auto=", ".join(decided), **row)
        print(table.markdown().splitlines()[-1], file=sys.stderr)
    report.emit([table], args.json)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = h.command(
        sub, "batching", cmd_batching, "dynamic batching by clients and queue delay; a fallback switch"
    )
    h.build_args(p, "vit-nano")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--delays-ms", default="0,1,4")
    p = h.command(sub, "warmup", cmd_warmup, "memory and first calls with and without the warm-up")
    h.build_args(p, "vit-tiny")
    p.add_argument("--hint", default="ADAPTIVE", choices=["LATENCY", "THROUGHPUT", "ADAPTIVE"])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--case", choices=["warmed", "cold"], help=argparse.SUPPRESS)  # the child's
    p = h.command(sub, "precision", cmd_precision, "f32 against bf16 and int8 on the CPU (OpenVINO)")
    p.add_argument("--models", default="vit-digits,vit-tiny")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--builds", type=Path, default=Path("/tmp/veo-edge-bench-cpu-precision"), help="reused")
    p.add_argument("--json", type=Path, default=None, help="also write the results here, as JSON")
    p = h.command(sub, "pays", cmd_pays, "whether batching pays on this CPU, per build; what auto decides")
    p.add_argument("--builds", required=True, help="build directories, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--starts", type=int, default=3, help="activations of the runner with --batch-limit auto")
    p.add_argument("--json", type=Path, default=None, help="also write the results here, as JSON")
    args = ap.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()

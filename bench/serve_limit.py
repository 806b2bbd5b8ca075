"""`veo-edge serve` against the machine's limit: raw OpenVINO in-process vs the server over HTTP and gRPC.

    python bench/serve_limit.py [--build-dir DIR] [--model vit-tiny] [--concurrency 1,2,4,8]
                                [--seconds 5] [--rounds 2] [--hint ADAPTIVE[,LATENCY,...]]
                                [--transports http,grpc,http-shm,grpc-shm] [--perf-analyzer PATH]
                                [--base-tree OTHER_CHECKOUT]
                                [--pytriton PYTHON]

Rows, on the same OpenVINO IR (the one the build serves: f32, or its int8 IR; the compiles state f32):
- ``raw sync b1``: one LATENCY-compiled infer request, batch 1, back to back (what one client can get),
  measured again at the start of every round (p50 pooled over rounds);
- ``raw limit bN``: an ``AsyncInferQueue`` over a THROUGHPUT-compiled model (OpenVINO's streams, its
  optimal number of infer requests) kept full at batch N for N in 1, 2, 4, 8; the best is the limit,
  measured again (at that batch) at the start of every round, the median over rounds used;
- ``static``: the same two with the batch axis fixed (at 1) before compiling, as ADAPTIVE serves a
  sample (a static shape runs faster than the IR's dynamic batch): ``raw sync b1 static``, and ``raw
  limit static b1`` with two infer requests per stream (one queued behind each running one). The rows
  report their share of both limits and their p50 against both syncs;
- ``serve http|grpc[-shm] cK``: one ``veo-edge serve`` process per ``--hint`` (its ``--performance-hint``; with
  several hints the rows are ``HINT http|grpc cK``, all interleaved), K closed-loop clients
  sending batch-1 binary requests with ``tritonclient`` (threads) or, with ``--perf-analyzer``, with
  Triton's perf_analyzer; ``-shm`` (``--transports``): inputs and outputs in system shared memory
  (the server with ``--shared-memory``). Transports and concurrencies are interleaved, ``--rounds`` times; throughput is
  the median over rounds, latency percentiles pool every round.
- ``base http|grpc cK`` (with ``--base-tree PATH``): the same server on another checkout's code
  (``PYTHONPATH``), interleaved with ours: before/after a change in one window.
- ``srv cpu/req``: the server process's CPU time per request in the cell (user + system, all threads),
  which a busy machine disturbs far less than latency.
- ``triton http|grpc cK`` (with ``--pytriton PYTHON``, a Python with nvidia-pytriton and openvino):
  Triton through PyTriton on the build's f32 IR, same 2 ms queue delay (``bench/pytriton_server.py``),
  interleaved with the rows above (for an int8 build: our int8 against Triton's f32).

All on loopback; bounded in time. The machine may be shared: check ``uptime`` first, and read the
numbers as noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _server import build_dir, percentiles, sample, server


def served_ir(bd) -> tuple[str, str]:
    """(precision, IR path) of what the build serves on the CPU: f32, or its int8 IR."""
    from veo_edge.runtime.loaders import served_precision

    precision = served_precision(bd, "openvino")
    return precision, str(bd.artifact("openvino_int8_xml" if precision == "int8" else "openvino_xml"))


def _read(core, xml: str, static: bool):
    """The IR, with its batch axis fixed at 1 when ``static`` (as ADAPTIVE compiles it)."""
    from veo_edge.runtime.backends.openvino import _batch_of_one

    model = core.read_model(xml)
    return _batch_of_one(model) if static else model


def sync_request(xml: str, static: bool = False):
    """One infer request on a LATENCY compile of ``xml`` (f32 stated): raw sync batch 1."""
    import openvino as ov

    from veo_edge.runtime.backends.openvino import compile_config

    core = ov.Core()
    compiled = core.compile_model(_read(core, xml, static), "CPU", compile_config("f32", hint="LATENCY"))
    return compiled.create_infer_request()


def time_sync(request, x: np.ndarray, seconds: float) -> dict:
    """``request`` run on ``x`` back to back for ``seconds`` (after 5 unmeasured runs)."""
    for _ in range(5):
        request.infer(x)
    lat = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        t = time.perf_counter()
        request.infer(x)
        lat.append(time.perf_counter() - t)
    return {"samples_s": len(lat) / sum(lat), **percentiles(lat)}


def raw_sync(xml: str, x: np.ndarray, seconds: float, static: bool = False) -> dict:
    return time_sync(sync_request(xml, static), x, seconds)


def raw_limit(xml: str, x1: np.ndarray, batch: int, seconds: float, static: bool = False) -> dict:
    """Samples/s of a THROUGHPUT compile kept full at ``batch``; ``static``: batch 1 fixed in the
    model, two infer requests per stream."""
    import openvino as ov

    from veo_edge.runtime.backends.openvino import compile_config

    core = ov.Core()
    compiled = core.compile_model(_read(core, xml, static), "CPU", compile_config("f32", hint="THROUGHPUT"))
    nreq = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")) * (2 if static else 1)
    x = np.ascontiguousarray(np.repeat(x1, batch, 0))
    queue = ov.AsyncInferQueue(compiled, nreq)
    for _ in range(2 * nreq):
        queue.start_async(x)
    queue.wait_all()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        queue.start_async(x)  # blocks while every infer request is busy
        n += 1
    queue.wait_all()
    return {"samples_s": n * batch / (time.perf_counter() - start), "requests": nreq}


class _ShmIO:
    """One client's input and output regions (``-shm`` transports): the tensor crosses no socket."""

    def __init__(self, tc, client, x: np.ndarray, tag: str) -> None:
        import tritonclient.utils.shared_memory as shm

        self.shm, self.client, self.tag = shm, client, tag
        out_bytes = 64 << 10  # the logits of any built-in model
        self.handles = [
            shm.create_shared_memory_region(f"in-{tag}", f"/bench-in-{tag}", x.nbytes),
            shm.create_shared_memory_region(f"out-{tag}", f"/bench-out-{tag}", out_bytes),
        ]
        shm.set_shared_memory_region(self.handles[0], [x])
        client.register_system_shared_memory(f"in-{tag}", f"/bench-in-{tag}", x.nbytes)
        client.register_system_shared_memory(f"out-{tag}", f"/bench-out-{tag}", out_bytes)
        self.input = tc.InferInput("input", list(x.shape), "FP32")
        self.input.set_shared_memory(f"in-{tag}", x.nbytes)
        self.output = tc.InferRequestedOutput("logits")
        self.output.set_shared_memory(f"out-{tag}", out_bytes)

    def close(self) -> None:
        for name in ("in", "out"):
            self.client.unregister_system_shared_memory(f"{name}-{self.tag}")
        for h in self.handles:
            self.shm.destroy_shared_memory_region(h)


def clients(transport: str, port: int, name: str, x: np.ndarray, k: int, seconds: float) -> dict:
    """K closed-loop tritonclient clients (threads); transport http, grpc, http-shm or grpc-shm."""
    if transport.startswith("http"):
        import tritonclient.http as tc
    else:
        import tritonclient.grpc as tc

    lat: list[float] = []
    errors, sent = [0], [0]
    lock = threading.Lock()
    start_at = time.perf_counter() + 0.5  # warm-up, not measured
    stop_at = start_at + seconds

    def worker(i: int) -> None:
        client = tc.InferenceServerClient(f"127.0.0.1:{port}")
        io = _ShmIO(tc, client, x, f"{os.getpid()}-{transport}-{i}") if transport.endswith("-shm") else None
        inp = io.input if io else tc.InferInput("input", list(x.shape), "FP32")
        if io is None:
            inp.set_data_from_numpy(x)
        outputs = [io.output] if io else None
        mine, bad, n = [], 0, 0
        while (now := time.perf_counter()) < stop_at:
            n += 1
            try:
                client.infer(name, [inp], outputs=outputs)
            except Exception:  # counted, not fatal: a bench reports what it saw
                bad += now >= start_at
                continue
            if now >= start_at:
                mine.append(time.perf_counter() - now)
        if io is not None:
            io.close()
        client.close()
        with lock:
            lat.extend(mine)
            errors[0] += bad
            sent[0] += n

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"samples_s": len(lat) / seconds, "lat": lat, "errors": errors[0], "sent": sent[0]}


def perf_analyzer(pa: str, transport: str, port: int, name: str, k: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pa.csv"
        cmd = [
            pa,
            "-m",
            name,
            "-u",
            f"127.0.0.1:{port}",
            "-i",
            transport.split("-")[0],
            *(["--shared-memory", "system"] if transport.endswith("-shm") else []),
            "--concurrency-range",
            f"{k}:{k}",
            "--measurement-interval",
            str(int(seconds * 1000)),
            "--max-trials",
            "3",  # bounded: a shared machine may never look stable
            "--stability-percentage",
            "1000",
            "-f",
            str(out),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 10 + 60)
        if not out.is_file():  # e.g. no stable measurement on a busy machine: reported, not fatal
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            print(f"  perf_analyzer {transport} c{k} failed ({done.returncode}): {tail[0]}")
            return {"samples_s": float("nan"), "p50": float("nan"), "p99": float("nan"), "errors": 1}
        row = next(csv.DictReader(out.open()))
    return {
        "samples_s": float(row["Inferences/Second"]),
        "p50": float(row["p50 latency"]),
        "p99": float(row["p99 latency"]),
        "errors": 0,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def pytriton(python: str | None, build: Path, timeout: float = 180.0):
    """Triton through PyTriton on ``build`` (``bench/pytriton_server.py``); yields its ports, or ``None``."""
    if not python:
        yield None
        return
    ports = {"http": _free_port(), "grpc": _free_port(), "metrics": _free_port()}
    script = Path(__file__).with_name("pytriton_server.py")
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        cmd = [python, str(script), str(build), *(f"--{k}-port={v}" for k, v in ports.items())]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while "pytriton ready" not in Path(log.name).read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PyTriton did not come up:\n{Path(log.name).read_text()[-3000:]}")
                time.sleep(0.2)
            yield ports
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=None, help="default: a fresh build of --model")
    ap.add_argument("--model", default="vit-tiny")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--hint", default="ADAPTIVE", help="the server's --performance-hint; several, comma-separated"
    )
    ap.add_argument(
        "--transports",
        default="http,grpc",
        help="comma-separated: http, grpc, http-shm, grpc-shm (system shared memory: the server runs with "
        "--shared-memory, perf_analyzer with --shared-memory system)",
    )
    ap.add_argument("--perf-analyzer", default=None, help="drive the server with this perf_analyzer binary")
    ap.add_argument("--base-tree", default=None, help="also serve another checkout's code ('base' rows)")
    ap.add_argument("--pytriton", default=None, help="a Python with nvidia-pytriton: compare against Triton")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still stops its servers
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"load: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (1-minute average)")
    with build_dir(args.build_dir, args.model) as build:
        from veo_edge.builddir import BuildDir

        bd = BuildDir.open(build)
        # the raw rows run the IR the server serves (an int8 build: its quantized IR); PyTriton the f32 one
        precision, xml = served_ir(bd)
        name = bd.model_name
        x = sample(build, 1)
        print(f"{name} ({precision} IR), batch 1 per request, {args.seconds:g} s per cell; latency in ms")
        syncs = [raw_sync(xml, x, args.seconds)]
        print(
            f"raw sync b1            {syncs[0]['samples_s']:8.1f} samples/s  p50 {syncs[0]['p50'] / 1e3:6.2f}"
        )
        by_batch: dict[int, float] = {}
        for b in (1, 2, 4, 8):
            if b > bd.max_batch:
                break
            r = raw_limit(xml, x, b, args.seconds)
            by_batch[b] = r["samples_s"]
            print(f"raw limit b{b} ({r['requests']} reqs) {r['samples_s']:8.1f} samples/s")
        best = max(by_batch, key=by_batch.__getitem__)
        limits = [by_batch[best]]  # this round's; later rounds measure again at the best batch
        static_syncs = [raw_sync(xml, x, args.seconds, static=True)]
        print(f"raw sync b1 static     {static_syncs[0]['samples_s']:8.1f} samples/s  p50 "
              f"{static_syncs[0]['p50'] / 1e3:6.2f}")  # fmt: skip
        r = raw_limit(xml, x, 1, args.seconds, static=True)
        static_limits = [r["samples_s"]]
        print(f"raw limit static b1 ({r['requests']} reqs) {r['samples_s']:8.1f} samples/s")
        cells: dict[tuple[str, str, int], list[dict]] = {}
        hints = [h.strip().upper() for h in args.hint.split(",") if h.strip()]
        transports = [t.strip() for t in args.transports.split(",") if t.strip()]
        shm_flag = ["--shared-memory"] if any(t.endswith("-shm") for t in transports) else []
        with contextlib.ExitStack() as stack:
            ours = {
                h: stack.enter_context(
                    server(build, "--max-queue", "4096", "--performance-hint", h, *shm_flag, ports=True)
                )
                for h in hints
            }
            triton = stack.enter_context(pytriton(args.pytriton, build))
            base = None
            if args.base_tree:  # another checkout's server, interleaved with ours (before/after a change)
                env = {"PYTHONPATH": str(Path(args.base_tree).resolve())}
                base = stack.enter_context(server(build, "--max-queue", "4096", env=env, ports=True))
            label = (lambda h: "serve") if len(hints) == 1 else (lambda h: h.lower()[:8])
            targets = [
                (label(h), t, ours[h][t.split("-")[0]], ours[h]["pid"]) for h in hints for t in transports
            ]
            if base:
                targets += [("base", t, base[t], base["pid"]) for t in transports if "-" not in t]
            targets += [("triton", t, triton[t.split("-")[0]], None) for t in transports] if triton else []
            for i in range(args.rounds):
                if i:  # raw sync and the limit again: the machine may be shared and drift
                    syncs.append(raw_sync(xml, x, args.seconds))
                    limits.append(raw_limit(xml, x, best, args.seconds)["samples_s"])
                    static_syncs.append(raw_sync(xml, x, args.seconds, static=True))
                    static_limits.append(raw_limit(xml, x, 1, args.seconds, static=True)["samples_s"])
                for k in levels:
                    for who, transport, port, pid in targets:
                        cpu = _cpu_s(pid)
                        if args.perf_analyzer:
                            r = perf_analyzer(args.perf_analyzer, transport, port, name, k, args.seconds)
                        else:
                            r = clients(transport, port, name, x, k, args.seconds)
                        if "sent" in r and pid:  # the server's CPU time per request: robust to a busy machine
                            r["cpu_ms"] = (_cpu_s(pid) - cpu) * 1e3 / max(r["sent"], 1)
                        cells.setdefault((who, transport, k), []).append(r)
        # p50s in µs, like the served rows' percentiles; printed in ms
        sync = _over_rounds("raw sync b1 p50", [r["p50"] for r in syncs], 1e-3, "ms", 2)
        limit = _over_rounds(f"raw limit (b{best})", limits, 1, "samples/s", 1)
        static_sync = _over_rounds("raw sync b1 static p50", [r["p50"] for r in static_syncs], 1e-3, "ms", 2)
        static_limit = _over_rounds("raw limit static b1", static_limits, 1, "samples/s", 1)
        print(
            f"{'':22} {'samples/s':>9} {'p50':>7} {'p99':>7} {'errors':>6} {'of limit':>8} {'static':>6} "
            f"{'p50-sync':>8} {'-static':>7} {'srv cpu/req':>11}"
        )
        rates: dict[tuple[str, str, int], float] = {}
        for k in levels:
            for who, transport, _, _ in targets:
                rs = cells[who, transport, k]
                cpu_ms = _median(r.get("cpu_ms", float("nan")) for r in rs)
                rate = _median(r["samples_s"] for r in rs)
                rates[who, transport, k] = rate
                if "lat" in rs[0]:
                    pct = percentiles([v for r in rs for v in r["lat"]] or [0.0])
                else:
                    pct = {"p50": _median(r["p50"] for r in rs), "p99": _median(r["p99"] for r in rs)}
                print(
                    f"{who:8} {transport:8} c{k:<4} {rate:9.1f} {pct['p50'] / 1e3:7.2f} {pct['p99'] / 1e3:7.2f} "
                    f"{sum(r['errors'] for r in rs):6d} {rate / limit:8.0%} {rate / static_limit:6.0%} "
                    f"{(pct['p50'] - sync) / 1e3:+8.2f} {(pct['p50'] - static_sync) / 1e3:+7.2f} "
                    f"{cpu_ms:8.2f} ms"
                )

        if triton:
            for who in dict.fromkeys(w for w, _, _, _ in targets if w not in ("triton", "base")):
                print(
                    f"{who} / triton throughput: "
                    + ", ".join(
                        f"{t} c{k} {rates[who, t, k] / rates['triton', t, k]:.2f}x"
                        for k in levels
                        for t in transports
                    )
                )


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` and its threads so far (0 without one)."""
    if not pid:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _over_rounds(label: str, values: list[float], scale: float, unit: str, digits: int) -> float:
    """Print a raw row's median over the rounds and each round's value (times ``scale``, in ``unit``);
    return the unscaled median."""
    median = _median(values)
    each = ", ".join(f"{v * scale:.{digits}f}" for v in values)
    print(f"{label} over {len(values)} round(s): {median * scale:.{digits}f} {unit} ({each})")
    return median


def _median(values) -> float:
    vs = [v for v in values if v == v]  # NaN: a cell perf_analyzer could not measure
    return statistics.median(vs) if vs else float("nan")


if __name__ == "__main__":
    main()

"""The harness the benches in ``bench/`` run on (imported as ``harness``; the scripts put ``bench/``
first on ``sys.path`` by being run as ``python bench/NAME.py``).

- command line: subcommands whose ``--help`` is their docstring, the options every bench shares;
- builds: one to bench on, made in a temporary directory or reused (``--build-dir``); seeded samples
  (the Hugging Face checkpoint of the picture and optimum-intel benches is ``bench/hf.py``'s);
- servers: ``veo-edge serve`` (this tree's code, or another checkout's through ``PYTHONPATH``) and Triton
  through PyTriton (``bench/pytriton_server.py``, another venv), on loopback, every port picked free;
- clients: callers that send one request (``http.client`` as perf_analyzer sends it, tritonclient HTTP or
  gRPC, optionally through system shared memory), driven by K closed-loop threads for N seconds or N
  requests; Triton's perf_analyzer when given; paired (interleaved) calls of several arms;

Raw OpenVINO in the bench's own process is ``bench/raw_ov.py``; statistics, result tables and their JSON
are ``bench/report.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import inspect
import json
import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from report import timed

# ---------------------------------------------------------------- command line


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``--help`` with every option's default, and the description as written."""


def command(
    sub: Any, name: str, run: Callable[[argparse.Namespace], None], help: str
) -> argparse.ArgumentParser:
    """Subcommand ``name`` of ``sub``, running ``run(args)``; its ``--help`` shows ``run``'s docstring."""
    p = sub.add_parser(
        name, help=help, description=inspect.cleandoc(run.__doc__ or help), formatter_class=_Help
    )
    p.set_defaults(run=run)
    return p


def build_args(ap: argparse.ArgumentParser, model: str) -> None:
    """``--build-dir`` / ``--model`` (default ``model``) and ``--json``: every bench's common options."""
    ap.add_argument("--build-dir", default=None, help="a build to bench on (none: a fresh build of --model)")
    ap.add_argument("--model", default=model, help="the built-in model to build")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here, as JSON")


# ---------------------------------------------------------------- builds


@contextlib.contextmanager
def build_dir(path: str | Path | None, model: str = "vit-nano", **options: Any) -> Iterator[Path]:
    """``path`` as given, or a fresh build of ``model`` (``BuildOptions`` ``options``) in a temporary
    directory, removed at exit."""
    if path:
        yield Path(path)
        return
    from veo_edge.export.source import BuiltinSource
    from veo_edge.pipeline.build import BuildOptions, run_build

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / model
        run_build(BuildOptions(source=BuiltinSource(model), out=out, quiet=True, **options))
        yield out


def sample(build: Path, batch: int = 1, seed: int = 0) -> np.ndarray:
    from veo_edge.builddir import BuildDir
    from veo_edge.export.parity import seeded_inputs

    return seeded_inputs(tuple(BuildDir.open(build).manifest["input_shape"]), batch, seed)


# ---------------------------------------------------------------- servers


@dataclass
class Server:
    """A server's loopback ports (``grpc``/``metrics`` None when off) and its process id."""

    http: int
    grpc: int | None
    metrics: int | None
    pid: int

    def port(self, transport: str) -> int:
        """The port of ``http``, ``grpc``, ``http-shm`` or ``grpc-shm``."""
        port = getattr(self, transport.split("-")[0])
        if port is None:
            raise RuntimeError(f"this server has no {transport} port")
        return port


@contextlib.contextmanager
def server(
    build: Path,
    *args: str,
    tree: str | Path | None = None,
    env: dict | None = None,
    timeout: float = 120.0,
    entry: str | None = None,
) -> Iterator[Server]:
    """``veo-edge serve BUILD ARGS`` on 127.0.0.1 with every port free (gRPC and metrics too, unless ARGS
    set them), up until ``/v2/health/ready`` answers 200; SIGTERM at exit. ``tree``: serve that
    checkout's ``veo_edge`` (``PYTHONPATH``); ``env`` is added to the server's environment; ``entry``: a
    script run instead of ``-m veo_edge.cli.main`` (bench/trace_server.py)."""
    ports = [a for a in ("--grpc-port", "--metrics-port") if a not in args]
    main = [entry] if entry else ["-m", "veo_edge.cli.main"]
    cmd = [sys.executable, *main, "serve", str(Path(build).resolve()), "--port", "0"]
    cmd += [x for a in ports for x in (a, "0")] + list(args)
    env = {**os.environ, **({"PYTHONPATH": str(Path(tree).resolve())} if tree else {}), **(env or {})}
    # run in the tree: ``-m`` puts the working directory ahead of PYTHONPATH, so a bench started in
    # another checkout would otherwise serve that checkout's code
    cwd = str(Path(tree).resolve()) if tree else None
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        try:
            deadline, port = time.monotonic() + timeout, None
            while port is None or not _ready(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not come up:\n{Path(log.name).read_text()[-3000:]}")
                m = re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", Path(log.name).read_text())
                port = int(m.group(1)) if m else None
                time.sleep(0.05)
            text = Path(log.name).read_text()
            grpc = re.search(r"gRPC on 127\.0\.0\.1:(\d+)", text)
            metrics = re.search(r"metrics on http://127\.0\.0\.1:(\d+)", text)
            yield Server(port, int(grpc[1]) if grpc else None, int(metrics[1]) if metrics else None, proc.pid)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
            proc.wait(60)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def pytriton(python: str | None, build: Path, timeout: float = 180.0) -> Iterator[Server | None]:
    """Triton through PyTriton on ``build``'s f32 IR, run by ``python`` (a venv with nvidia-pytriton and
    openvino); yields its ports, or ``None`` without ``python``."""
    if not python:
        yield None
        return
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
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
            yield Server(ports["http"], ports["grpc"], ports["metrics"], 0)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its threads so far (0 without one)."""
    if not pid:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def model_stats(port: int, name: str) -> dict:
    """The server's ``/v2/models/NAME/stats`` entry of ``name`` (counts, queue and compute ns)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{name}/stats", timeout=10) as r:
        return json.load(r)["model_stats"][0]


# ---------------------------------------------------------------- clients


class HttpCall:
    """One kept-alive ``http.client`` connection sending one request per call; returns the status as a
    string. ``infer(build, port)``: a batch-1 binary infer request, as perf_analyzer sends it."""

    def __init__(self, port: int, method: str, path: str, body: bytes | None = None, headers=None) -> None:
        import http.client

        self.errors = (OSError, http.client.HTTPException)
        self.new = lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.conn, self.args = self.new(), (method, path, body, headers or {})

    @classmethod
    def infer(cls, build: Path, port: int, batch: int = 1) -> HttpCall:
        from veo_edge.builddir import BuildDir
        from veo_edge.serve.protocol import encode_infer_request

        bd = BuildDir.open(build)
        m = bd.manifest
        body, hlen = encode_infer_request(
            {m["inputs"][0]["name"]: sample(build, batch)}, outputs=[m["outputs"][0]["name"]]
        )
        headers = {"Inference-Header-Content-Length": str(hlen), "Content-Type": "application/octet-stream"}
        return cls(port, "POST", f"/v2/models/{bd.model_name}/infer", body, headers)

    def __call__(self) -> str:
        try:
            self.conn.request(*self.args)
            r = self.conn.getresponse()
            r.read()
            return str(r.status)
        except self.errors:
            self.conn.close()
            self.conn = self.new()
            raise

    def close(self) -> None:
        self.conn.close()


class TritonCall:
    """One ``tritonclient`` client (``http``/``grpc``; ``-shm``: the tensors in system shared memory, the
    server run with ``--shared-memory``) sending ``x`` as a binary infer request per call."""

    def __init__(self, transport: str, port: int, name: str, x: np.ndarray, tag: str = "0") -> None:
        if transport.startswith("http"):
            import tritonclient.http as tc
        else:
            import tritonclient.grpc as tc
        self.client, self.name, self.regions = tc.InferenceServerClient(f"127.0.0.1:{port}"), name, []
        self.input, self.outputs = tc.InferInput("input", list(x.shape), "FP32"), None
        if not transport.endswith("-shm"):
            self.input.set_data_from_numpy(x)
            return
        import tritonclient.utils.shared_memory as shm

        tag = f"{os.getpid()}-{transport}-{tag}"
        out_bytes = 64 << 10  # the logits of any built-in model
        self.shm = shm
        for region, size in ((f"in-{tag}", x.nbytes), (f"out-{tag}", out_bytes)):
            handle = shm.create_shared_memory_region(region, f"/bench-{region}", size)
            self.regions.append((region, handle))
            self.client.register_system_shared_memory(region, f"/bench-{region}", size)
        shm.set_shared_memory_region(self.regions[0][1], [x])
        self.input.set_shared_memory(f"in-{tag}", x.nbytes)
        output = tc.InferRequestedOutput("logits")
        output.set_shared_memory(f"out-{tag}", out_bytes)
        self.outputs = [output]

    def __call__(self) -> str:
        self.client.infer(self.name, [self.input], outputs=self.outputs)
        return "200"

    def close(self) -> None:
        for region, handle in self.regions:
            self.client.unregister_system_shared_memory(region)
            self.shm.destroy_shared_memory_region(handle)
        self.client.close()


def closed_loop(
    make_call: Callable[[int], Callable[[], str]],
    clients: int,
    seconds: float,
    requests: int | None = None,
    warmup_s: float = 0.5,
) -> dict:
    """``clients`` threads, client i calling ``make_call(i)`` back to back: unmeasured for ``warmup_s``,
    then for ``seconds`` (or until each made ``requests`` calls). A call returns the status ("200" is
    answered: its latency is kept) or raises (counted by the exception's name). Returns answered/s, the
    latencies (ms), errors, the statuses, and every call made (warm-up included)."""
    lat: list[float] = []
    codes: dict[str, int] = {}
    sent, lock = [0], threading.Lock()
    start_at = time.perf_counter() + warmup_s
    stop_at, ended = start_at + seconds, [start_at]

    def worker(i: int) -> None:
        call, mine, seen, n, measured = make_call(i), [], {}, 0, 0
        while (now := time.perf_counter()) < stop_at and (requests is None or measured < requests):
            n += 1
            try:
                code = call()
            except Exception as e:  # counted, not fatal: a bench reports what it saw
                code = type(e).__name__
            if now >= start_at:
                measured += 1
                seen[code] = seen.get(code, 0) + 1
                if code == "200":
                    mine.append((time.perf_counter() - now) * 1e3)
        getattr(call, "close", lambda: None)()
        with lock:
            lat.extend(mine)
            sent[0] += n
            ended[0] = max(ended[0], time.perf_counter())
            for k, v in seen.items():
                codes[k] = codes.get(k, 0) + v

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = min(seconds, ended[0] - start_at) if requests else seconds
    errors = sum(codes.values()) - codes.get("200", 0)
    return {"rate": len(lat) / max(wall, 1e-9), "lat": lat, "errors": errors, "codes": codes, "sent": sent[0]}


def perf_analyzer(
    pa: str, model: str, port: int, transport: str, clients: int, seconds: float, extra: tuple[str, ...] = ()
) -> dict:
    """One perf_analyzer cell (batch 1, ``clients`` concurrent, at most 3 trials of ``seconds``): its CSV
    row as floats, plus ``rate`` (inferences/s), ``p50``/``p90``/``p99`` (ms), ``errors``. A cell it cannot
    measure (a busy machine never looks stable) is reported and given NaN; ``client_cpu_s``: the CPU
    perf_analyzer itself used over its whole run (user + system), which the server could not have. The
    CUDA runtime of the tritonclient wheel's venv, when there, is put on its library path."""
    libs = [str(p) for p in Path(pa).resolve().parents[1].glob("lib/python3*/site-packages/nvidia/*/lib")]
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join([*libs, os.environ.get("LD_LIBRARY_PATH", "")])}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pa.csv"
        cmd = [pa, "-m", model, "-u", f"127.0.0.1:{port}", "-i", transport.split("-")[0], *extra]
        cmd += ["--shared-memory", "system"] if transport.endswith("-shm") else []
        cmd += [
            "--concurrency-range",
            f"{clients}:{clients}",
            "--measurement-interval",
            str(int(seconds * 1e3)),
        ]
        cmd += ["--max-trials", "3", "--stability-percentage", "1000", "-f", str(out)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 10 + 60, env=env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        client_cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if not out.is_file():
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            print(
                f"  perf_analyzer {transport} c{clients} failed ({done.returncode}): {tail[0]}",
                file=sys.stderr,
            )
            return {
                "rate": float("nan"),
                "p50": float("nan"),
                "p90": float("nan"),
                "p99": float("nan"),
                "errors": 1,
            }
        row = {k: float(v) for k, v in next(csv.DictReader(out.open())).items() if _number(v)}
    row.update({f"p{q}": row[f"p{q} latency"] / 1e3 for q in (50, 90, 99)}, rate=row["Inferences/Second"])
    return {**row, "errors": 0, "client_cpu_s": client_cpu_s}


def _number(v: str) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def paired(
    arms: dict[str, Callable[[], Any]], n: int, seed: int = 0, warm: int = 20
) -> dict[str, list[float]]:
    """``n`` rounds, each calling every arm once in a random order (seeded): the latencies (ms) per arm,
    round by round, so that the machine's drift weighs on every arm alike. ``warm`` rounds unmeasured."""
    for _ in range(warm):
        for call in arms.values():
            call()
    rng = random.Random(seed)
    ms: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(n):
        order = list(arms)
        rng.shuffle(order)
        for k in order:
            ms[k].append(timed(arms[k]))
    return ms

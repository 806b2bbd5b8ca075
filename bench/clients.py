"""The clients the benches drive servers with (imported as ``clients``, beside ``harness``): callers that
send one request (``http.client`` as perf_analyzer sends it, tritonclient HTTP or gRPC, optionally through
system shared memory), driven by K closed-loop threads for N seconds or N requests; Triton's perf_analyzer
when given (with its own CPU time); paired (interleaved) calls of several arms.
"""

from __future__ import annotations

import csv
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import sample
from report import timed


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

    @classmethod
    def infer_shm(cls, build: Path, port: int) -> HttpCall:
        """A batch-1 JSON infer request whose input and output lie in system shared memory (as
        perf_analyzer's ``--shared-memory system`` sends it; the server run with ``--shared-memory``):
        two regions made and registered here, unregistered and removed at :meth:`close`."""
        import json

        import tritonclient.utils.shared_memory as shm

        from veo_edge.builddir import BuildDir

        bd, x = BuildDir.open(build), sample(build, 1)
        (i, o), tag = (bd.manifest[k][0]["name"] for k in ("inputs", "outputs")), f"{os.getpid()}-{port}"
        regions, refs = [], []
        for name, size in ((f"in-{tag}", x.nbytes), (f"out-{tag}", 64 << 10)):
            handle = shm.create_shared_memory_region(name, f"/bench-{name}", size)
            regions.append((name, handle))
            reg = json.dumps({"key": f"/bench-{name}", "offset": 0, "byte_size": size}).encode()
            if (
                status := HttpCall(port, "POST", f"/v2/systemsharedmemory/region/{name}/register", reg)()
            ) != "200":
                raise RuntimeError(f"registering {name} answered {status}: serve with --shared-memory")
            refs.append({"shared_memory_region": name, "shared_memory_byte_size": size})
        shm.set_shared_memory_region(regions[0][1], [x])
        body = {
            "inputs": [{"name": i, "shape": list(x.shape), "datatype": "FP32", "parameters": refs[0]}],
            "outputs": [{"name": o, "parameters": refs[1]}],
        }
        call = cls(port, "POST", f"/v2/models/{bd.model_name}/infer", json.dumps(body).encode())
        call.regions, call.shm = regions, shm
        return call

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
        for name, handle in getattr(self, "regions", ()):
            HttpCall(self.conn.port, "POST", f"/v2/systemsharedmemory/region/{name}/unregister")()
            self.shm.destroy_shared_memory_region(handle)
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

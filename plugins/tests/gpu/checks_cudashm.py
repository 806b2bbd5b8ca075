"""The cudashm section of the GPU checks: ``veo-edge serve`` (shared memory on) reading its input from, and
writing its output to, CUDA memory that another process exported (tritonclient's
``utils.cuda_shared_memory``, cudaIPC handles), over HTTP and gRPC. Each answer must equal the same input
sent inline; the region status lists the regions; an offset past a region and an unregistered region are
400s that break nothing; the server exits 0 on SIGTERM. The server's backend choice (``/metrics``) is
printed, so the log also says what the fallback chain made of this GPU host.

Run through ``run_gpu_checks.py --sections cudashm [--model-dir DIR]``; the client, not the server, owns
the regions, as with Triton.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except OSError as e:
        return getattr(e, "code", 0) or 0, str(e)


def start_server(model_dir: Path, log: Path) -> tuple[subprocess.Popen, dict]:
    http, grpc, metrics = _free_ports(3)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "veo_edge", "serve", str(model_dir), "--port", str(http)]
    cmd += ["--grpc-port", str(grpc), "--metrics-port", str(metrics), "--shared-memory"]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    urls = {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}", "metrics": f"127.0.0.1:{metrics}"}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"veo-edge serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        if _get(f"http://{urls['http']}/v2/health/ready")[0] == 200:
            return proc, urls
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"veo-edge serve was not ready in 120 s:\n{log.read_text()[-3000:]}")


def _round_trip(protocol: str, urls: dict, model: str, meta: dict, lines: list[str]) -> bool:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.cuda_shared_memory as cudashm
    from tritonclient.utils import InferenceServerException

    mod = httpclient if protocol == "http" else grpcclient
    c = mod.InferenceServerClient(urls[protocol])
    (inp_meta,), (out_meta,) = meta["inputs"], meta["outputs"]
    shape = [2] + [int(d) for d in inp_meta["shape"][1:]]
    x = np.random.default_rng(7 if protocol == "http" else 8).standard_normal(shape).astype(np.float32)

    def infer(region: str | None, size: int = 0, offset: int = 0, out: tuple[str, int] | None = None):
        """One request: the input inline (``region`` None) or in a region; the output inline, or in the
        region ``out`` names (name, byte size)."""
        i = mod.InferInput(inp_meta["name"], shape, "FP32")
        if region is None:
            i.set_data_from_numpy(x)
        else:
            i.set_shared_memory(region, size, offset=offset)
        o = mod.InferRequestedOutput(out_meta["name"])
        if out is not None:
            o.set_shared_memory(*out)
        return c.infer(model, [i], outputs=[o])

    want = infer(None).as_numpy(out_meta["name"])
    hin = cudashm.create_shared_memory_region(f"in-{protocol}", x.nbytes, 0)
    hout = cudashm.create_shared_memory_region(f"out-{protocol}", want.nbytes, 0)
    ok = True
    try:
        cudashm.set_shared_memory_region(hin, [x])
        cudashm.set_shared_memory_region(hout, [np.full(want.shape, np.nan, np.float32)])  # poison
        c.register_cuda_shared_memory(f"in-{protocol}", cudashm.get_raw_handle(hin), 0, x.nbytes)
        c.register_cuda_shared_memory(f"out-{protocol}", cudashm.get_raw_handle(hout), 0, want.nbytes)
        status = c.get_cuda_shared_memory_status()
        names = {r["name"] for r in status} if protocol == "http" else set(status.regions)
        listed = {f"in-{protocol}", f"out-{protocol}"} <= names
        infer(f"in-{protocol}", x.nbytes, out=(f"out-{protocol}", want.nbytes))
        got = cudashm.get_contents_as_numpy(hout, np.float32, list(want.shape))
        diff = float(np.abs(got - want).max())
        equal = bool(np.isfinite(got).all()) and diff <= 1e-5 * max(1.0, float(np.abs(want).max()))
        refused = []
        for args in ((f"in-{protocol}", x.nbytes, 4), (f"nope-{protocol}", x.nbytes, 0)):
            try:
                infer(*args)
                refused.append(False)
            except InferenceServerException as e:
                refused.append(e.status() in ("400", "StatusCode.INVALID_ARGUMENT"))
        again = infer(f"in-{protocol}", x.nbytes).as_numpy(out_meta["name"])  # still works after them
        still = again is not None and float(np.abs(again - want).max()) <= 1e-5 * max(1.0, np.abs(want).max())
        t_inline = _p50(lambda: infer(None))
        t_shm = _p50(lambda: infer(f"in-{protocol}", x.nbytes, out=(f"out-{protocol}", want.nbytes)))
        c.unregister_cuda_shared_memory()
        status = c.get_cuda_shared_memory_status()
        released = (status if protocol == "http" else list(status.regions)) == []
        ok = listed and equal and all(refused) and still and released
        lines.append(
            f"cudashm {protocol:<4}: batch {shape[0]}, max|shm - inline| {diff:.1e}, listed {listed}, "
            f"bad offset/unknown region 400 {refused}, works after {still}, released {released}; "
            f"p50 inline {t_inline:.2f} ms, cudashm {t_shm:.2f} ms  {'PASS' if ok else 'FAIL'}"
        )
    finally:
        cudashm.destroy_shared_memory_region(hin)
        cudashm.destroy_shared_memory_region(hout)
    return ok


def _p50(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def run(model_dir: Path, log_dir: Path) -> tuple[bool, list[str]]:
    """Both protocols against one server; (all passed, report lines)."""
    import tritonclient.http as httpclient

    log = log_dir / "cudashm-serve.log"
    proc, urls = start_server(model_dir, log)
    lines: list[str] = []
    ok = True
    try:
        c = httpclient.InferenceServerClient(urls["http"])
        (model,) = [m["name"] for m in c.get_model_repository_index()]
        meta = c.get_model_metadata(model)
        chosen = [
            ln
            for ln in _get(f"http://{urls['metrics']}/metrics")[1].splitlines()
            if ln.startswith(("veo_edge_active_backend", "veo_edge_backend_skipped"))
        ]
        lines += [f"server backends: {ln}" for ln in chosen]
        for protocol in ("http", "grpc"):
            try:
                ok &= _round_trip(protocol, urls, model, meta, lines)
            except Exception as e:  # one line, then the other protocol still runs
                ok = False
                lines.append(f"cudashm {protocol}: FAIL ({type(e).__name__}: {e})")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 60 s"
    lines.append(f"server exit on SIGTERM: {rc}")
    ok &= rc == 0
    if not ok:
        lines.append(log.read_text()[-3000:])
    return ok, lines

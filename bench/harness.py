"""The harness the benches in ``bench/`` run on (imported as ``harness``; the scripts put ``bench/``
first on ``sys.path`` by being run as ``python bench/NAME.py``).

- command line: subcommands whose ``--help`` is their docstring, the options every bench shares;
- builds: one to bench on, made in a temporary directory or reused (``--build-dir``); seeded samples
  (the Hugging Face checkpoint of the picture and optimum-intel benches is ``bench/hf.py``'s);
- servers: ``veo-edge serve`` (this tree's code, or another checkout's through ``PYTHONPATH``) and Triton
  through PyTriton (``bench/pytriton_server.py``, another venv), on loopback, every port picked free;

The clients that drive the servers are ``bench/clients.py``; raw OpenVINO in the bench's own process is ``bench/raw_ov.py``; statistics, result tables and their JSON
are ``bench/report.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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

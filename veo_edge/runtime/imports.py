"""A fallback backend's Python package imported in a child process first, so that a package whose import
kills the process costs that backend, not the server.

A native crash at import cannot be caught: the process is gone. Seen: ONNX Runtime 1.32 on aarch64 under
QEMU user emulation, where ``/proc/cpuinfo`` is the host's and ONNX Runtime's CPU detection segfaults
(with an Arm ``/proc/cpuinfo`` it imports); ONNX Runtime's tracker has more (an assertion on a Jetson,
a segfault in images without ``/bin``). The first backend of the order is imported in-process at once,
as before (nothing to fall back from yet, and start-up stays as fast); every later one is checked in a
child started beside the first one's load (:meth:`~veo_edge.runtime.runtime.Runtime.start`), and a
child killed by a signal makes its backend skipped with the reason.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable

#: backend -> the package it imports
MODULES = {
    "openvino": "openvino",
    "onnxruntime": "onnxruntime",
    "onnxruntime-cuda": "onnxruntime",
    "tensorrt": "tensorrt",
}
#: a child that has not imported within this long is a verdict too (a hang here would hang the server)
TIMEOUT_S = 300.0
#: the child yields the CPU to the first backend's compile: measured on vit-tiny, 2 cores, start to ready
#: +0.4 s at the normal priority, within the noise (+0.05-0.1 s) at this one
NICE = ("nice", "-n", "15") if shutil.which("nice") else ()


class _Check:
    """One child ``python -c "import MODULE"``, run on a daemon thread; ``reason`` once ``done``."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.done = threading.Event()
        self.reason: str | None = None
        threading.Thread(target=self._run, name=f"veo-edge-import-{module}", daemon=True).start()

    def _run(self) -> None:
        from veo_edge.privacy import child_prelude

        try:
            child = subprocess.run(
                [*NICE, sys.executable, "-c", f"{child_prelude()}import {self.module}"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            self.reason = f"importing {self.module} did not finish in {TIMEOUT_S:.0f} s in a child process"
        except OSError:
            pass  # no child to be had: the in-process import decides, as without this check
        else:
            # killed by a signal; an ordinary error (exit status 1) is the in-process import's to report
            if child.returncode < 0:
                try:
                    name = signal.Signals(-child.returncode).name
                except ValueError:
                    name = f"signal {-child.returncode}"
                said = child.stderr.decode(errors="replace").strip().splitlines()
                last = f" (it said: {said[-1][:200]})" if said else ""
                self.reason = (
                    f"importing {self.module} killed a child process with {name}{last}; it would kill this "
                    "process too, so it is not imported here"
                )
        finally:
            self.done.set()


_checks: dict[str, _Check] = {}
_lock = threading.Lock()


def start_import_checks(backends: Iterable[str]) -> None:
    """Start, without waiting, a child import of each backend's package not imported in this process
    yet (once per package and process)."""
    if not sys.executable:
        return
    with _lock:
        for backend in backends:
            module = MODULES.get(backend)
            if module and module not in sys.modules and module not in _checks:
                _checks[module] = _Check(module)


def import_crash(backend: str) -> str | None:
    """Why ``backend``'s package must not be imported in this process (its child import was killed by a
    signal, or hung); ``None`` when it was imported fine, failed in an ordinary way, or was not checked."""
    module = MODULES.get(backend)
    with _lock:
        check = _checks.get(module) if module else None
    if check is None:
        return None
    check.done.wait()
    return check.reason

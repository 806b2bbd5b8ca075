"""Jetson ``tegrastats`` lines parsed into numbers (no Jetson needed to test: the parser reads text).

The format, as NVIDIA's Jetson Linux developer guide documents it (fields appear only where the module
has them; JetPack 5/6 print a timestamp first and ``mW`` units)::

    [MM-DD-YYYY HH:MM:SS] RAM 2448/7620MB (lfb 1x4MB) SWAP 0/3810MB (cached 0MB) IRAM 0/252kB(lfb 252kB)
    CPU [2%@1190,off,...] EMC_FREQ 0%@2133 GR3D_FREQ 0%@[305,305] NVENC 1075 APE 174
    CPU@44.5C GPU@42.09C tj@44.5C VDD_IN 4123mW/4123mW VDD_CPU_GPU_CV 491mW/491mW

Values: memory in bytes (``ram_used``, ``ram_total``, ``swap_used``, ``swap_total``, ``lfb_blocks``,
``lfb_block_bytes``), ``cpu_percent`` (mean of the online cores) and ``cpu_online``, ``emc_percent``,
``gpu_percent`` (GR3D), temperatures as ``temp_<name>_c``, power rails as ``power_<name>_mw`` (current)
and ``power_<name>_avg_mw``. Unknown fields are ignored, so a newer tegrastats still parses.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from typing import Any

_UNIT = {"b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}
_MEM = re.compile(r"\b(RAM|SWAP)\s+(\d+)/(\d+)\s*([kKmMgG]?B)")
_LFB = re.compile(r"\(lfb\s+(\d+)x(\d+)\s*([kKmMgG]?B)\)")
_CPU = re.compile(r"\bCPU\s+\[([^\]]*)\]")
_FREQ = re.compile(r"\b(EMC_FREQ|GR3D_FREQ)\s+(\d+)%")
_TEMP = re.compile(r"\b([A-Za-z][\w-]*)@(-?\d+(?:\.\d+)?)C\b")
_RAIL = re.compile(r"\b(VDD_\w+|POM_\w+|VIN_\w+)\s+(\d+)(?:mW)?/(\d+)(?:mW)?")


def parse_line(line: str) -> dict[str, float]:
    """The numbers of one tegrastats line (an empty dict when it holds none)."""
    out: dict[str, float] = {}
    for m in _MEM.finditer(line):
        key, unit = m.group(1).lower(), _UNIT[m.group(4).lower()]
        out[f"{key}_used"] = int(m.group(2)) * unit
        out[f"{key}_total"] = int(m.group(3)) * unit
    m = _LFB.search(line)
    if m:
        out["lfb_blocks"] = int(m.group(1))
        out["lfb_block_bytes"] = int(m.group(2)) * _UNIT[m.group(3).lower()]
    m = _CPU.search(line)
    if m:
        loads = [float(c.split("%")[0]) for c in m.group(1).split(",") if "%" in c]
        out["cpu_online"] = len(loads)
        if loads:
            out["cpu_percent"] = sum(loads) / len(loads)
    for m in _FREQ.finditer(line):
        out["emc_percent" if m.group(1) == "EMC_FREQ" else "gpu_percent"] = float(m.group(2))
    for m in _TEMP.finditer(line):
        if m.group(1) in ("CPU", "GPU") and f"temp_{m.group(1).lower()}_c" in out:
            continue
        temp = float(m.group(2))
        if temp > -200:  # -256C marks an absent sensor (CV0..CV2 on some modules)
            out[f"temp_{m.group(1).lower()}_c"] = temp
    for m in _RAIL.finditer(line):
        name = m.group(1).lower()
        out[f"power_{name}_mw"] = float(m.group(2))
        out[f"power_{name}_avg_mw"] = float(m.group(3))
    return out


class TegraStats:
    """``tegrastats --interval MS`` in the background; ``latest()`` is the last parsed line (or None)."""

    def __init__(self, interval_ms: int = 1000, executable: str | None = None) -> None:
        self.executable = executable or shutil.which("tegrastats")
        self.interval_ms = interval_ms
        self._latest: dict[str, float] | None = None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.executable is not None

    def start(self) -> TegraStats:
        if self.executable is None:
            return self
        self._proc = subprocess.Popen(
            [self.executable, "--interval", str(self.interval_ms)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, name="veo-soak-tegrastats", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parsed = parse_line(line)
            if parsed:
                self._latest = parsed

    def latest(self) -> dict[str, Any] | None:
        return self._latest

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._proc = None

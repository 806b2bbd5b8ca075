"""Statistics and results of the benches: the time of one call, percentiles, a bootstrap interval of a
median; a markdown table per result, and all of them as JSON (``--json PATH``) for ``bench/plot.py``,
with the machine the numbers depend on.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TREE = Path(__file__).resolve().parent.parent  # this checkout: the default tree a server runs


def timed(call: Callable[[], Any]) -> float:
    """Run ``call`` once; its time in ms."""
    t = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - t) / 1e6


def percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms or [float("nan")], dtype=float)
    return {f"p{q}": float(np.percentile(a, q)) for q in (50, 90, 99)} | {"mean": float(a.mean())}


def median(values) -> float:
    """The median, NaNs (cells that could not be measured) left out."""
    vs = [v for v in values if v == v]
    return statistics.median(vs) if vs else float("nan")


def median_ci(values: list[float], seed: int = 0, draws: int = 1000) -> tuple[float, float, float]:
    """(median, low, high): the median of ``values`` and its percentile-bootstrap 95 % interval (scipy)."""
    from scipy.stats import bootstrap

    a = np.asarray(values, dtype=float)
    ci = bootstrap((a,), np.median, n_resamples=draws, method="percentile", rng=np.random.default_rng(seed))
    return float(np.median(a)), float(ci.confidence_interval.low), float(ci.confidence_interval.high)


# ---------------------------------------------------------------- results


class Table:
    """One result: rows of named values, printed as a markdown table; ``columns`` maps a row key to its
    header and format (``"{:.2f}"``); keys not in ``columns`` only go to the JSON."""

    def __init__(self, title: str, columns: dict[str, tuple[str, str]]) -> None:
        self.title, self.columns, self.rows = title, columns, []

    def add(self, **row: Any) -> None:
        self.rows.append(row)

    def markdown(self) -> str:
        def cell(key: str, row: dict) -> str:
            v = row.get(key)
            return "" if v is None else self.columns[key][1].format(v)

        lines = [f"### {self.title}", "", "| " + " | ".join(h for h, _ in self.columns.values()) + " |"]
        lines.append("|" + " --- |" * len(self.columns))
        lines += ["| " + " | ".join(cell(k, r) for k in self.columns) + " |" for r in self.rows]
        return "\n".join(lines)


def machine() -> dict:
    """What the numbers depend on: CPU flags, CPUs, load, OpenVINO, this tree's commit."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        flags = []
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    commit = subprocess.run(
        ["git", "-C", str(TREE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    try:
        import openvino as ov

        openvino = ov.get_version()
    except ImportError:
        openvino = None
    return {
        "cpu_flags": [f for f in wanted if f in flags],
        "cpus": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2),
        "openvino": openvino,
        "commit": commit.stdout.strip() or None,
    }


def emit(tables: list[Table], json_path: Path | None, **meta: Any) -> None:
    """Print every table with columns as markdown; with ``json_path``, write every table there, with the
    command and the machine."""
    for t in tables:
        if t.columns:
            print(f"\n{t.markdown()}")
    if json_path:
        doc = {
            "command": "python " + shlex.join(sys.argv),
            "machine": machine(),
            **meta,
            "tables": [{"title": t.title, "rows": t.rows} for t in tables],
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(doc, indent=1, default=float) + "\n")
        print(f"\nwrote {json_path}")

"""Disk use and memory of the soak itself: an in-process soak at a fixed rate (default 100 req/s).

    python bench/soak_disk.py [--build-dir DIR] [--model vit-nano] [--rate 100] [--duration 60s]
                              [--window 5s] [--sample-interval 1s]

Prints the run directory's size per hour of run (soak.db after the final WAL checkpoint), the bytes per
window and per sample row, and the soak process's RSS slope after warm-up (the recorder's own memory
is bounded: per-window histograms, everything else on disk).
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
from pathlib import Path

from _server import build_dir

from veo_edge.soak.config import SoakConfig, Thresholds
from veo_edge.soak.report import write_report
from veo_edge.soak.run import start
from veo_edge.soak.units import parse_duration


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir")
    ap.add_argument("--model", default="vit-nano")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", default="60s")
    ap.add_argument("--window", default="5s")
    ap.add_argument("--sample-interval", default="1s")
    args = ap.parse_args()
    with build_dir(args.build_dir, args.model) as build, tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        config = SoakConfig(
            duration_s=parse_duration(args.duration),
            build_dir=str(build),
            rate=args.rate,
            backend="openvino",
            window_s=parse_duration(args.window),
            sample_s=parse_duration(args.sample_interval),
            thresholds=Thresholds(max_jitter_ms=1e9, leak_floor_bytes_per_h=1e15),
        )
        start(config, run, live=False)
        db = run / "soak.db"
        size = db.stat().st_size
        report = write_report(run)
        conn = sqlite3.connect(db)
        per_table = {}
        for table in ("windows", "samples", "events"):
            per_table[table] = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        hist = conn.execute("SELECT AVG(LENGTH(hist)) FROM windows WHERE hist IS NOT NULL").fetchone()[0]
        extra = conn.execute("SELECT AVG(LENGTH(extra)) FROM samples").fetchone()[0]
        conn.close()
        hours = report["run"]["recorded_s"] / 3600
        answered = report["requests"]["ok"]
        print(
            f"{args.model} in-process, open loop {args.rate:g} req/s for {report['run']['recorded_s']:.0f} s:"
        )
        print(
            f"  answered {answered} ({answered / report['run']['recorded_s']:.1f}/s), errors {report['requests']['errors']}"
        )
        print(f"  soak.db {size / 1e6:.3f} MB -> {size / hours / 1e6:.2f} MB per hour of run")
        print(
            f"  rows: {per_table}; mean histogram {hist or 0:.0f} B/window, sample extra {extra or 0:.0f} B"
        )
        lat = report["latency_ms"]["after_warmup"]
        print(
            f"  latency after warm-up: p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, max {lat['max']:.2f} ms"
        )
        fit = report["leak"]["rss"]
        print(
            f"  RSS slope after warm-up {fit['bytes_per_hour'] / 2**20:+.1f} MiB/h "
            f"(95% CI {fit['low'] / 2**20:+.1f}..{fit['high'] / 2**20:+.1f})"
        )


if __name__ == "__main__":
    main()

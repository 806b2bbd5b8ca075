"""Disk use and memory of the soak itself: an in-process soak at a fixed rate (default 100 req/s).

    python bench/soak_disk.py [--build-dir DIR] [--model vit-nano] [--rate 100] [--duration 60s]
                              [--window 5s] [--sample-interval 1s] [--json PATH]

Prints the run directory's size per hour of run (soak.db after the final WAL checkpoint), the bytes per
window and per sample row, the latency after the warm-up, and the soak process's RSS slope after it (the
recorder's own memory is bounded: per-window histograms, everything else on disk). ``--json`` also
writes the RSS and USS samples over time and the windows' p50/p99, which ``bench/plot.py`` draws.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import tempfile
from pathlib import Path

import harness as h
import report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    h.build_args(ap, "vit-nano")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", default="60s")
    ap.add_argument("--window", default="5s")
    ap.add_argument("--sample-interval", default="1s")
    args = ap.parse_args()
    from veo_edge.soak.config import SoakConfig, Thresholds
    from veo_edge.soak.report import write_report
    from veo_edge.soak.run import start
    from veo_edge.soak.units import parse_duration

    with h.build_dir(args.build_dir, args.model) as build, tempfile.TemporaryDirectory() as tmp:
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
        soak = write_report(run)
        with contextlib.closing(sqlite3.connect(db)) as conn:
            rows = {
                t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("windows", "samples", "events")
            }
            hist = conn.execute("SELECT AVG(LENGTH(hist)) FROM windows WHERE hist IS NOT NULL").fetchone()[0]
            extra = conn.execute("SELECT AVG(LENGTH(extra)) FROM samples").fetchone()[0]
            memory = conn.execute("SELECT t, rss, uss FROM samples ORDER BY segment, t").fetchall()
            windows = conn.execute("SELECT t1, p50_us, p99_us FROM windows ORDER BY segment, t1").fetchall()
    seconds = soak["run"]["recorded_s"]
    lat, fit = soak["latency_ms"]["after_warmup"], soak["leak"].get("rss")  # none: too short a run
    table = report.Table(
        f"the soak's own cost: {args.model} in-process, open loop {args.rate:g} req/s for {seconds:.0f} s",
        {"what": ("", "{}"), "value": ("", "{}")},
    )
    answered = soak["requests"]["ok"]
    table.add(
        what="answered",
        value=f"{answered} ({answered / seconds:.1f}/s), errors {soak['requests']['errors']}",
    )
    table.add(
        what="soak.db", value=f"{size / 1e6:.3f} MB: {size / (seconds / 3600) / 1e6:.2f} MB per hour of run"
    )
    table.add(
        what="rows",
        value=f"{rows}; mean histogram {hist or 0:.0f} B a window, sample extra {extra or 0:.0f} B",
    )
    table.add(
        what="latency after warm-up",
        value=f"p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, max {lat['max']:.2f} ms",
    )
    table.add(
        what="RSS slope after warm-up",
        value=f"{fit['bytes_per_hour'] / 2**20:+.1f} MiB/h (95 % {fit['low'] / 2**20:+.1f}..{fit['high'] / 2**20:+.1f})"
        if fit
        else "none fitted (too short a run)",
    )
    series = report.Table("memory over time", {})  # no columns: JSON only, for bench/plot.py
    for t, rss, uss in memory:
        series.add(t_s=t, rss_mib=rss / 2**20 if rss else None, uss_mib=uss / 2**20 if uss else None)
    latency = report.Table("latency over time", {})
    for t, p50, p99 in windows:
        latency.add(t_s=t, p50_ms=p50 / 1e3 if p50 else None, p99_ms=p99 / 1e3 if p99 else None)
    report.emit([table, series, latency], args.json)


if __name__ == "__main__":
    main()

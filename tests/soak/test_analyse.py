"""The analysis on a run of known content, written through the run store as the soak writes it: jitter
from known per-window medians, a leak slope recovered from a known linear trend in noise, a pool's
fragmentation series (check and plot), and a run stopped early."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from veo_edge.soak.config import SoakConfig, Thresholds
from veo_edge.soak.fragmentation import fragmentation
from veo_edge.soak.load import Recorder
from veo_edge.soak.report import write_report
from veo_edge.soak.store import RunStore

MiB = 1 << 20


def _write_run(run_dir: Path, *, slope_per_h: float, blocks_at, p50_us, duration=60.0, complete=True):
    config = SoakConfig(duration_s=duration, url="http://127.0.0.1:1", rate=10, window_s=5, warmup_s=10)
    store = RunStore.create(run_dir, config.to_dict())
    store.begin_segment(pid=1)
    rng = np.random.default_rng(0)
    rec = Recorder()
    end = duration if complete else duration / 2
    for k in range(int(end // 5)):
        for _ in range(50):
            rec.issue()
            rec.complete(p50_us(k))
        row, _ = rec.roll(5.0 * k, 5.0 * (k + 1))
        store.add_window(row)
    for i in range(1, int(end) + 1):
        t = float(i)
        frag = fragmentation(blocks_at(t))
        store.add_sample(
            {
                "t": t,
                "wall": 1e9 + t,
                "rss": int(500 * MiB + slope_per_h * t / 3600 + rng.normal(0, 64 << 10)),
                "pool_in_use": 8 * MiB,
                "pool_free": frag.free_bytes,
                "pool_largest": frag.largest_free,
                "pool_fragmentation": frag.fragmentation,
                "pool_entropy": frag.entropy_bits,
                "fallbacks": 0,
                "batches": 10 * i,
                "active_backend": "tensorrt",
            }
        )
    store.end_segment("complete" if complete else "SIGINT", 0)
    store.set_status("complete" if complete else "stopped")
    store.close()


def test_known_run(tmp_path: Path):
    run = tmp_path / "run"
    # medians 3.0, 3.2, ..., 5.2 ms over 12 windows; the first two (warm-up, 10 s) are left out
    _write_run(
        run,
        slope_per_h=100 * MiB,
        blocks_at=lambda t: [4 * MiB] if t < 30 else [1 * MiB, 1 * MiB, 2 * MiB],
        p50_us=lambda k: 3000 + 200 * k,
    )
    report = write_report(run, Thresholds(max_jitter_ms=0.8, leak_floor_bytes_per_h=MiB))
    jit = report["jitter"]
    assert jit["windows"] == 10
    assert jit["p50_min_ms"] == pytest.approx(3.4, rel=1e-3) and jit["p50_max_ms"] == pytest.approx(
        5.2, rel=1e-3
    )
    assert jit["jitter_ms"] == pytest.approx(0.9, rel=1e-2)
    fit = report["leak"]["rss"]
    assert fit["bytes_per_hour"] == pytest.approx(100 * MiB, rel=0.1)
    assert 0 < fit["low"] <= fit["bytes_per_hour"] <= fit["high"]  # a 95 % interval away from 0: a leak
    assert fit["samples"] == 51  # t = 10..60 s
    assert report["leak"]["pool_in_use"]["bytes_per_hour"] == 0
    assert report["batches_per_hour"] == pytest.approx(36000)
    frag = report["fragmentation"]
    assert frag["final"] == pytest.approx(0.5) and frag["max"] == pytest.approx(0.5)
    assert frag["entropy_bits_final"] == pytest.approx(1.5)
    checks = {c["name"]: c["pass"] for c in report["verdict"]["checks"]}
    assert checks == {
        "duration": True,
        "rate": True,  # open loop: every arrival was sent
        "errors": True,
        "lost": True,
        "jitter": False,  # ±0.9 ms > ±0.8 ms
        "leak:rss": False,
        "leak:pool_in_use": True,
        "fragmentation": True,  # 0.5 <= 0.5
    }
    assert "fragmentation.png" in report["plots"] and (run / "fragmentation.png").is_file()
    md = (run / "report.md").read_text()
    assert md.startswith("# Soak report: FAIL") and "![fragmentation](fragmentation.png)" in md
    assert json.loads((run / "report.json").read_text())["verdict"]["pass"] is False

    relaxed = write_report(
        run, Thresholds(max_jitter_ms=1.0, leak_floor_bytes_per_h=200 * MiB, max_fragmentation=0.4)
    )
    checks = {c["name"]: c["pass"] for c in relaxed["verdict"]["checks"]}
    assert checks["jitter"] and checks["leak:rss"] and not checks["fragmentation"]


def test_stopped_run_fails_on_duration(tmp_path: Path):
    run = tmp_path / "run"
    _write_run(run, slope_per_h=0, blocks_at=lambda t: [MiB], p50_us=lambda k: 3000, complete=False)
    report = write_report(run, Thresholds(leak_floor_bytes_per_h=10 * MiB))
    checks = {c["name"]: c for c in report["verdict"]["checks"]}
    assert not checks["duration"]["pass"] and checks["duration"]["detail"] == "ran 30.0 s of 60.0 s (stopped)"
    assert checks["leak:rss"]["pass"] and checks["jitter"]["pass"]
    assert report["jitter"]["jitter_ms"] == 0


def test_long_runs_are_reduced_not_truncated(tmp_path: Path, monkeypatch):
    """A 72-hour run has ~50k windows and ~260k samples: the report merges windows (medians of p50,
    maxima above) and fits bin medians; here with the limits lowered to see it on a small run."""
    from veo_edge.soak import analyse, fits

    monkeypatch.setattr(analyse, "MAX_WINDOWS_KEPT", 4)
    monkeypatch.setattr(fits, "MAX_FIT_POINTS", 20)
    run = tmp_path / "run"
    _write_run(run, slope_per_h=100 * MiB, blocks_at=lambda t: [MiB], p50_us=lambda k: 3000 + 200 * k)
    report = write_report(run, Thresholds(max_jitter_ms=1.0))
    assert report["windows_stride"] == 3 and len(report["windows"]) == 4
    first = report["windows"][0]
    assert (first["t0"], first["t1"], first["samples"]) == (0.0, 15.0, 150)
    assert first["p50"] == pytest.approx(3.2, rel=1e-3) and first["max"] == pytest.approx(3.4, rel=1e-3)
    assert report["jitter"]["windows"] == 10  # jitter still sees every window
    fit = report["leak"]["rss"]
    assert fit["fit_points"] == 20 and fit["samples"] == 51
    assert fit["bytes_per_hour"] == pytest.approx(100 * MiB, rel=0.1)

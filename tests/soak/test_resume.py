"""A soak killed with SIGKILL keeps everything it committed, and `--resume` completes the full duration;
SIGTERM ends a run cleanly with a report."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from veo_edge.soak.store import RunStore

CLI = [sys.executable, "-m", "veo_edge.cli.main", "soak"]
LENIENT = ["--max-jitter-ms", "1e6", "--leak-floor", "1T", "--no-live"]


def _committed(db: Path, table: str) -> int:
    if not db.is_file():
        return 0
    conn = sqlite3.connect(db, timeout=5)
    try:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    except sqlite3.OperationalError:  # schema not there yet
        return 0
    finally:
        conn.close()


def _start_and_wait(args: list[str], db: Path, windows: int, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        proc = subprocess.Popen([*CLI, *args], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while _committed(db, "windows") < windows:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    return proc


def test_sigkill_keeps_samples_and_resume_completes(nano_build: Path, tmp_path: Path):
    run = tmp_path / "run"
    db = run / "soak.db"
    args = [
        str(nano_build),
        "--duration",
        "12s",
        "--rate",
        "20",
        "--window",
        "2s",
        "--sample-interval",
        "0.5s",
    ]
    args += ["--out", str(run), *LENIENT]
    proc = _start_and_wait(args, db, 4, tmp_path / "first.log")  # 3 closed, the 4th open
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    kept_windows, kept_samples = _committed(db, "windows"), _committed(db, "samples")
    assert kept_windows >= 3 and kept_samples >= 12
    store = RunStore.open(run)
    assert store.meta()["status"] == "running"
    killed_at = store.recorded_until()
    assert 0 < killed_at < 12
    store.close()
    assert not (run / "report.json").exists()

    done = subprocess.run(
        [*CLI, "--resume", str(run), "--no-live"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((run / "report.json").read_text())
    assert report["run"]["status"] == "complete"
    assert report["run"]["recorded_s"] >= 12
    segs = report["run"]["segments"]
    assert [s["end_reason"] for s in segs] == ["killed (no clean end)", "complete"]
    assert segs[1]["offset_s"] == killed_at
    assert _committed(db, "windows") > kept_windows and _committed(db, "samples") > kept_samples
    assert report["requests"]["lost"] == 0 and report["requests"]["errors"] == 0
    assert {c["name"]: c["pass"] for c in report["verdict"]["checks"]}["duration"]

    again = subprocess.run([*CLI, "--resume", str(run)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 51
    assert "is complete; nothing to resume" in again.stderr


def test_sigterm_ends_cleanly_with_a_report(nano_build: Path, tmp_path: Path):
    run = tmp_path / "run"
    args = [str(nano_build), "--duration", "10m", "--concurrency", "2", "--window", "1s", "--warmup", "0s"]
    args += ["--sample-interval", "0.25s", "--out", str(run), *LENIENT]
    proc = _start_and_wait(args, run / "soak.db", 3, tmp_path / "term.log")
    os.kill(proc.pid, signal.SIGTERM)
    rc = proc.wait(60)
    assert rc == 50, (tmp_path / "term.log").read_text()  # the duration check fails: it ran < 10m
    report = json.loads((run / "report.json").read_text())
    assert report["run"]["status"] == "stopped"
    assert report["run"]["segments"][0]["end_reason"] == "SIGTERM"
    assert report["requests"]["lost"] == 0 and report["requests"]["issued"] == report["requests"]["ok"] > 0
    failed = [c["name"] for c in report["verdict"]["checks"] if not c["pass"]]
    assert failed == ["duration"]

"""What an interrupted soak counts toward its duration, and what a ``--resume`` issues: the run time of a
segment ends where it stopped issuing (the drain after a SIGINT is recorded, not counted), and an open
loop resumed after a SIGINT or a SIGKILL issues exactly rate x duration arrivals in all."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

from tests.soak.test_resume import CLI, LENIENT, _committed, _start_and_wait
from veo_edge.soak.store import RunStore

#: every runner call takes 300 ms: at SIGINT a batch is always in flight, so the drain takes time
SLOW = ["--chaos", '{"*": {"slow_ms": 300}}']


def _resume(run: Path) -> dict:
    done = subprocess.run(
        [*CLI, "--resume", str(run), "--no-live"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((run / "report.json").read_text())


def test_the_drain_after_sigint_is_not_run_time_and_resume_issues_the_rest(nano_build: Path, tmp_path: Path):
    run = tmp_path / "run"
    rate, duration = 10, 6
    args = [str(nano_build), "--duration", f"{duration}s", "--rate", str(rate), "--window", "1s"]
    args += ["--sample-interval", "0.5s", "--warmup", "0s", "--out", str(run), *SLOW, *LENIENT]
    proc = _start_and_wait(args, run / "soak.db", 2, tmp_path / "first.log")
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(60) == 50, (tmp_path / "first.log").read_text()  # duration: it ran less than planned
    first = json.loads((run / "report.json").read_text())
    stopped_at = first["run"]["ran_s"]
    # the requests in flight at SIGINT were answered after it: recorded, not counted as run time
    assert 0 < stopped_at < first["run"]["recorded_s"] < duration
    duration_check = {c["name"]: c for c in first["verdict"]["checks"]}["duration"]
    assert not duration_check["pass"] and duration_check["value"] == stopped_at
    assert first["requests"]["lost"] == 0

    report = _resume(run)
    req = report["requests"]
    assert req["issued"] == rate * duration  # the rest of the arrivals, none skipped for the drain
    assert req["issued"] == req["ok"] + req["errors"] + req["timeouts"] + req["not_sent"] + req["lost"]
    segs = report["run"]["segments"]
    assert [s["end_reason"] for s in segs] == ["SIGINT", "complete"]
    assert segs[1]["offset_s"] == first["run"]["recorded_s"]  # the time line goes on after the drain
    assert duration - 1e-6 <= report["run"]["ran_s"] < report["run"]["recorded_s"]
    assert {c["name"]: c["pass"] for c in report["verdict"]["checks"]}["duration"]
    store = RunStore.open(run)
    assert store.meta()["status"] == "complete"
    store.close()


def test_sigkill_mid_window_loses_at_most_a_sample_interval_and_resume_issues_the_rest(
    nano_build: Path, tmp_path: Path
):
    run, db = tmp_path / "run", tmp_path / "run" / "soak.db"
    rate, duration = 20, 8
    args = [str(nano_build), "--duration", f"{duration}s", "--rate", str(rate), "--window", "4s"]
    args += ["--sample-interval", "0.5s", "--out", str(run), *LENIENT]
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*CLI, *args], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while _committed(db, "samples") < 12:  # the baseline and 11 ticks: 5.5 s, inside the second window
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    conn = sqlite3.connect(db)
    counted_to = conn.execute("SELECT MAX(t1) FROM windows").fetchone()[0]
    sampled_to = conn.execute("SELECT MAX(t) FROM samples").fetchone()[0]
    issued = conn.execute("SELECT SUM(issued) FROM windows").fetchone()[0]
    conn.close()
    # the open window's counts were committed with the last sample: nothing between them is lost
    assert counted_to == sampled_to > 4.0
    assert issued >= rate * (counted_to - 0.5)

    report = _resume(run)
    req = report["requests"]
    assert req["issued"] == rate * duration  # the arrivals after the last commit are issued again
    done = req["ok"] + req["errors"] + req["timeouts"] + req["not_sent"] + req["lost"]
    assert req["issued"] == done + req["in_flight_when_killed"]
    assert [s["end_reason"] for s in report["run"]["segments"]] == ["killed (no clean end)", "complete"]
    assert report["run"]["segments"][1]["offset_s"] == sampled_to
    ws = report["windows"]
    assert ws[0]["t0"] == 0 and all(a["t1"] == b["t0"] for a, b in itertools.pairwise(ws))
    killed_window = next(w for w in ws if w["t1"] == counted_to)
    assert killed_window["samples"] > 0 and killed_window["p50"] is not None  # summarised by the report
    assert {c["name"]: c["pass"] for c in report["verdict"]["checks"]}["duration"]

"""A soak that asks more than the server (or this client) can do, and one whose server dies mid-run,
against a real `veo-edge serve`: the run stops on time, every arrival is accounted for once (answered,
an error, a timeout, not sent by the client, lost), the offered rate that was not sustained fails the
run and says so, and a server that stopped answering is a failed check of its own."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
from pathlib import Path

import pytest

from veo_edge.cli.main import main


def _soak(run: Path, capsys, *args: str) -> tuple[int, dict, str]:
    with pytest.raises(SystemExit) as exc:
        main(["soak", *args, "--out", str(run), "--no-live"])
    capsys.readouterr()
    return exc.value.code, json.loads((run / "report.json").read_text()), (run / "report.md").read_text()


def _accounted(req: dict) -> None:
    done = req["ok"] + req["errors"] + req["timeouts"] + req["not_sent"] + req["lost"]
    assert req["issued"] == done and req["sent"] == req["issued"] - req["not_sent"], req
    assert sum(req["error_kinds"].values()) == req["errors"] + req["timeouts"], req["error_kinds"]


def _windows_cover(report: dict) -> None:
    ws = report["windows"]
    assert ws[0]["t0"] == 0 and ws[-1]["t1"] == pytest.approx(report["run"]["recorded_s"])
    assert all(a["t1"] == b["t0"] for a, b in itertools.pairwise(ws))


def test_an_offered_rate_far_above_the_server_is_reported_not_hidden(
    nano_build: Path, server, tmp_path, capsys
):
    url = server(nano_build)
    timeout = 1.0
    args = ["--url", url, "--duration", "3s", "--rate", "20000", "--timeout", f"{timeout:g}s"]
    code, report, md = _soak(tmp_path / "run", capsys, *args, "--window", "1s", "--sample-interval", "0.5s")
    req, run = report["requests"], report["run"]
    assert code == 50 and run["status"] == "complete"
    # the run ends at its duration; only requests already sent may take up to their timeout after it
    assert run["planned_s"] <= run["recorded_s"] <= run["planned_s"] + timeout + 5
    _accounted(req)
    assert req["not_sent"] > 0 and req["lost"] == 0  # the client's own backlog is not the server's loss
    assert req["offered_rps"] == 20000 and req["sent_rps"] < 20000
    assert req["issued"] == 20000 * 3  # every arrival scheduled before the end, none after it
    # open loop: latency from the scheduled send; an answer later than the timeout is a timeout
    assert req["latency_from"] == "scheduled send (open loop)"
    if report["latency_ms"]["overall"]:
        # (the histograms keep 3 significant digits: a 999.999 ms answer reads as 1000.447 ms)
        assert report["latency_ms"]["overall"]["max"] <= timeout * 1e3 * (1 + 1e-3)
    checks = {c["name"]: c for c in report["verdict"]["checks"]}
    assert not checks["rate"]["pass"] and "NOT sustained" in checks["rate"]["detail"]
    assert checks["server"]["pass"] and checks["duration"]["pass"]
    assert "**the offered rate was not sustained**" in md and "not sent (client backlog)" in md
    # every arrival not sent has its reason, in report.json and report.md, adding up to not_sent
    why = req["not_sent_why"]
    assert sum(why.values()) == req["not_sent"] and all(n > 0 for n in why.values()), why
    assert set(why) <= {
        "the client's backlog of 100000 arrivals was full",
        f"waited in the client's backlog past the {timeout:g} s timeout",
        "still in the client's backlog when the run ended",
        "due while the client's scheduler was behind; its CPU could not keep the rate",
    }, why
    assert f"- not sent, by reason ({req['not_sent']} in all):" in md
    assert all(f"  - {n}: {reason}" in md for reason, n in why.items()), md
    _windows_cover(report)


def test_a_server_that_dies_mid_run_fails_the_run_and_says_so(nano_build: Path, server, tmp_path, capsys):
    url = server(nano_build)
    proc = server.proc
    killer = threading.Timer(3.0, os.kill, (proc.pid, signal.SIGTERM))
    killer.start()
    try:
        args = ["--url", url, "--duration", "6s", "--rate", "20", "--timeout", "1s"]
        code, report, md = _soak(
            tmp_path / "run", capsys, *args, "--window", "2s", "--sample-interval", "0.5s"
        )
    finally:
        killer.cancel()
    proc.wait(30)
    req = report["requests"]
    assert code == 50
    _accounted(req)
    assert req["errors"] > 0 and any(k.startswith("error: ") for k in req["error_kinds"])
    checks = {c["name"]: c for c in report["verdict"]["checks"]}
    server_check = checks["server"]
    assert (
        not server_check["pass"]
        and "still down at the end (it died or was stopped)" in server_check["detail"]
    )
    assert report["server"]["down_at_end"] is True and 2.5 < report["server"]["down_at_s"] < 6.5
    # one window with answers after the warm-up, a few memory samples: no jitter, no leak fit; skipped
    for name in ("jitter", "leak"):
        if name in checks:
            assert checks[name].get("skipped") or checks[name]["value"] is not None
    if report["jitter"]["windows"] < 2:
        assert checks["jitter"]["skipped"] and "skipped (too few windows)" in checks["jitter"]["detail"]
    if "leak" in checks:
        assert checks["leak"]["skipped"] and checks["leak"]["pass"]
    assert "**stopped answering at" in md and "never came back" in md
    _windows_cover(report)

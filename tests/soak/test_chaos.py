"""A soak's chaos schedule in human units: what it parses to, its errors, and a 12-second in-process
soak whose timed faults the report counts, each one a fallback that lost no request."""

from __future__ import annotations

from pathlib import Path

import pytest

from veo_edge.errors import UsageError
from veo_edge.soak.chaos import parse_chaos
from veo_edge.soak.config import SoakConfig, Thresholds
from veo_edge.soak.report import write_report
from veo_edge.soak.run import start


def test_schedules_in_human_units_give_the_faults_json_form() -> None:
    assert parse_chaos("oom every 10m, device_lost once at 30m") == {
        "*": [{"every_s": 600.0, "error": "oom"}, {"once_at_s": 1800.0, "error": "device_lost"}]
    }
    assert parse_chaos(" onnxruntime: backend after 2h , openvino:device-lost at 90s") == {
        "onnxruntime": {"after_s": 7200.0, "error": "backend"},
        "openvino": {"once_at_s": 90.0, "error": "device_lost"},
    }
    assert parse_chaos('{"onnxruntime": {"every_nth": 5}}') == {"onnxruntime": {"every_nth": 5}}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("oom every", r"'oom every' is not of the form '\[BACKEND:\] ERROR every\|once at\|after DURATION'"),
        ("segfault every 10m", r"unknown error 'segfault'; choose one of: oom, device_lost, backend"),
        ("gpu: oom every 10m", r"names backend 'gpu'; choose one of: tensorrt, "),
        ("oom every 0s", r"the time '0s' must be > 0"),
        ("oom every 10 minutes", r"is not of the form"),
        ("oom at 10x", r"the time '10x' is not a duration"),
        ("oom every 10m,,", r"has an empty item"),
        ('{"onnxruntime": {"every_s": "10m"}}', r"every_s='10m' .* expected a number of seconds > 0"),
        ("{nope", r"--chaos is not valid JSON"),
    ],
)
def test_bad_schedules_say_what_to_write(text: str, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        parse_chaos(text)


def test_a_timed_chaos_soak_counts_its_faults_and_loses_nothing(nano_build: Path, tmp_path: Path) -> None:
    config = SoakConfig(
        duration_s=12,
        build_dir=str(nano_build),
        rate=20,
        window_s=2,
        policy=["onnxruntime", "openvino"],
        # an OOM of the first backend every 3 s and its device lost once at 5 s; the runtime returns to
        # it at most every 0.5 s, so the schedule keeps finding it
        chaos=parse_chaos("onnxruntime: oom every 3s, onnxruntime: device_lost once at 5s"),
        recover_interval_s=0.5,
        thresholds=Thresholds(max_jitter_ms=1e6, leak_floor_bytes_per_h=1 << 40),
    )
    start(config, tmp_path / "run", live=False)
    report = write_report(tmp_path / "run")
    req, chaos, fb = report["requests"], report["chaos"], report["fallbacks"]
    assert req["issued"] == req["ok"] > 0 and req["errors"] == req["timeouts"] == req["lost"] == 0
    assert chaos["schedule"] == config.chaos
    injected = chaos["injected"]
    assert set(injected) <= {"onnxruntime: oom every_s=3", "onnxruntime: device_lost once_at_s=5"}
    assert injected["onnxruntime: device_lost once_at_s=5"] == 1
    # periods 1..4 of a 12 s run: the drain at its end still answers calls, at 12.0 s and a little on
    assert 1 <= injected["onnxruntime: oom every_s=3"] <= 4
    assert chaos["total"] == sum(injected.values())
    # an OOM is transient: its batch is re-run on openvino (the warm standby) and the traffic stays; the
    # lost device moves it at once; every fault is counted (warm-ups of a recovery included)
    assert fb["switches"] == 1 and fb["recoveries"] >= 1
    assert fb["faults"] == {"onnxruntime": {"device_lost": 1, "oom": injected["onnxruntime: oom every_s=3"]}}
    assert set(fb["retries"]) == {"openvino"} and fb["retries"]["openvino"]["ok"] >= 1
    events = [e["detail"] for e in report["events"] if e["kind"] == "chaos"]
    assert sum(int(d.split()[0]) for d in events) == chaos["total"]
    assert f"- chaos: {chaos['total']} faults injected (" in (tmp_path / "run" / "report.md").read_text()
    assert {c["name"]: c["pass"] for c in report["verdict"]["checks"]}["lost"]

"""Clear errors for bad input: a missing, foreign, corrupt or non-empty run directory, bad durations,
contradictory options; `soak report` thresholds decide the exit code."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from veo_edge.cli.main import main
from veo_edge.errors import RunDirError, UsageError
from veo_edge.soak.config import SoakConfig
from veo_edge.soak.store import RunStore


def _cli(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    captured = capsys.readouterr()
    return exc.value.code, captured.out + captured.err


def test_missing_run_dir(tmp_path: Path):
    with pytest.raises(
        RunDirError, match=r"run directory .*nope does not exist; give the --out of a `veo-edge soak` run"
    ):
        RunStore.open(tmp_path / "nope")


def test_not_a_run_dir(tmp_path: Path):
    with pytest.raises(RunDirError, match=r"is not a soak run directory \(no soak.db\)"):
        RunStore.open(tmp_path)


def test_corrupt_database(tmp_path: Path):
    (tmp_path / "soak.db").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(RunDirError, match=r"soak.db is corrupt or not a veo-edge soak database"):
        RunStore.open(tmp_path)


def test_foreign_sqlite_database(tmp_path: Path):
    conn = sqlite3.connect(tmp_path / "soak.db")
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('format', '\"something-else\"')")
    conn.commit()
    conn.close()
    with pytest.raises(
        RunDirError, match=r"is an SQLite database of something else \(format 'something-else'"
    ):
        RunStore.open(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    conn = sqlite3.connect(other / "soak.db")
    conn.execute("CREATE TABLE songs (title TEXT)")
    conn.close()
    with pytest.raises(RunDirError, match=r"corrupt or not a veo-edge soak database \(no such table: meta\)"):
        RunStore.open(other)


def test_out_must_be_new_or_empty(tmp_path: Path):
    (tmp_path / "x.txt").write_text("keep me")
    config = SoakConfig(duration_s=1, url="http://127.0.0.1:1")
    with pytest.raises(RunDirError, match=r"is not empty; a soak writes into a new directory \(choose a new"):
        RunStore.create(tmp_path, config.to_dict())
    assert (tmp_path / "x.txt").read_text() == "keep me"


def test_config_errors():
    with pytest.raises(UsageError, match=r"give a BUILD_DIR \(in-process\) or --url URL"):
        SoakConfig(duration_s=1)
    with pytest.raises(UsageError, match=r"--rate \(open loop\) and --concurrency \(closed loop\) exclude"):
        SoakConfig(duration_s=1, url="http://h:1", rate=5, concurrency=2)
    with pytest.raises(UsageError, match=r"--chaos injects faults into the runtime in this process"):
        SoakConfig(duration_s=1, url="http://h:1", chaos={"*": {"every_nth": 2}})
    with pytest.raises(UsageError, match=r"--batch 0 must be >= 1"):
        SoakConfig(duration_s=1, url="http://h:1", batch=0)
    with pytest.raises(UsageError, match=r"--metrics-url goes with --url \(a server\)"):
        SoakConfig(duration_s=1, build_dir="b", metrics_url="http://h:1/metrics")
    with pytest.raises(UsageError, match=r"--metrics-url 'h:1/metrics' is not an http:// URL"):
        SoakConfig(duration_s=1, url="grpc://h:1", metrics_url="h:1/metrics")


def test_cli_errors_are_one_line_with_distinct_codes(capsys, tmp_path: Path, nano_build: Path):
    code, out = _cli(capsys, "soak", str(nano_build), "--duration", "10x", "--out", str(tmp_path / "r"))
    assert code == 2 and "--duration '10x' is not a duration; expected a number and a unit" in out
    assert not (tmp_path / "r").exists()
    code, out = _cli(capsys, "soak", "report", str(tmp_path / "missing"))
    assert code == 51 and "does not exist" in out
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "soak.db").write_bytes(b"\0" * 4096)
    code, out = _cli(capsys, "soak", "--resume", str(tmp_path / "bad"))
    assert code == 51 and "corrupt or not a veo-edge soak database" in out
    code, out = _cli(
        capsys, "soak", str(nano_build), "--duration", "5s", "--chaos", '{"onnxruntime": {"every": 2}}'
    )
    assert code == 2 and "unknown fault option(s) ['every']" in out
    code, out = _cli(capsys, "soak", str(nano_build), "--duration", "5s", "--chaos", "oom evry 10m")
    assert code == 2 and "--chaos item 'oom evry 10m' is not of the form" in out
    code, out = _cli(capsys, "soak", "--resume", str(tmp_path / "bad"), "--duration", "5s")
    assert code == 2 and "--resume continues a run with its own settings; drop --duration" in out
    code, out = _cli(capsys, "soak", str(tmp_path), "--duration", "5s", "--out", str(tmp_path / "r"))
    assert code == 7 and not (tmp_path / "r").exists()  # not a build directory: BuildDirError
    code, out = _cli(capsys, "soak", str(nano_build), "--duration", "5s", "--recover-interval", "soon")
    assert code == 2 and "--recover-interval 'soon' is not a duration" in out
    for off in ("off", "OFF"):  # no recovery clock, in any case: the options pass, the build dir does not
        code, out = _cli(capsys, "soak", str(tmp_path), "--duration", "5s", "--recover-interval", off)
        assert code == 7, out


def test_unreachable_server_leaves_no_run_dir(capsys, tmp_path: Path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out = _cli(
        capsys, "soak", "--url", f"http://127.0.0.1:{port}", "--duration", "5s", "--out", str(tmp_path / "r")
    )
    assert code == 2 and "cannot reach the server at" in out and "start it with `veo-edge serve`" in out
    assert not (tmp_path / "r").exists()
    assert "warning: --duration 5.0s leaves 4.5s after the 0.5s warm-up" in out  # said before the run


def test_a_run_too_short_for_a_verdict_is_said_with_the_least_that_works():
    u = "http://127.0.0.1:1"
    short = SoakConfig(duration_s=5, url=u).too_short()
    assert (
        "2 whole 5.0s windows and the leak fit 8 samples at 1.0s" in short and "with at least 12.0s" in short
    )
    assert "those checks will read skipped" in short
    assert SoakConfig(duration_s=12, url=u).too_short() is None  # 10.8 s after 1.2 s: 2 windows, 8 samples
    assert SoakConfig(duration_s=11, url=u).too_short() is not None
    assert "with at least 1m08s" in SoakConfig(duration_s=60, url=u, warmup_s=58).too_short()
    assert SoakConfig(duration_s=3, url=u, window_s=1, sample_s=0.2).too_short() is None
    assert SoakConfig(duration_s=72 * 3600, url=u).too_short() is None
    # over gRPC without --metrics-url no memory is sampled: only the jitter's window is needed
    grpc = SoakConfig(duration_s=5, url="grpc://127.0.0.1:1").too_short()
    assert "2 whole 5.0s windows: those checks will read skipped" in grpc and "leak" not in grpc
    assert SoakConfig(duration_s=12, url="grpc://127.0.0.1:1").too_short() is None


def test_the_progress_line_says_dash_until_the_first_window(capsys):
    from veo_edge.soak.live import Progress

    with Progress(60, "t") as p:  # not a terminal here: plain lines on stderr
        p.update(1.0, {"errors": 0, "rss": 100 << 20})
        p._last_line = 0.0
        p.update(12.0, {"rate": 41.5, "p50_ms": 1.234, "p99_ms": float("nan"), "errors": 0, "rss": 100 << 20})
        p._last_line = 0.0
        p.update(13.0, {"errors": 0, "not_sent": 7, "rss": 100 << 20})
    first, later, overloaded = capsys.readouterr().err.splitlines()
    assert overloaded.endswith("NOT SENT 7 (client backlog)")
    assert "soak 1.0s/1m00s: - req/s, p50 -, p99 -, errors 0" in first
    assert "41.5 req/s, p50 1.23 ms, p99 -," in later

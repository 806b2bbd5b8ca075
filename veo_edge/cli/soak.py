"""``veo-edge soak``: a long stability run (in-process or against a server) that ends in a report with a
verdict; ``veo-edge soak report RUN_DIR`` analyses a run (again, with other thresholds)."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.core import TyperGroup

from veo_edge.cli._common import console, print_json

#: exit code of a soak whose verdict is "fail" (errors of the run itself have their own codes)
VERDICT_FAIL = 50


class _DefaultRun(TyperGroup):
    """``veo-edge soak BUILD_DIR ...`` means ``veo-edge soak run BUILD_DIR ...``."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_DefaultRun,
    help="Stability runs: `veo-edge soak BUILD_DIR|--url URL --duration 72h --out RUN_DIR`, "
    "`veo-edge soak --resume RUN_DIR`, `veo-edge soak report RUN_DIR`.",
    no_args_is_help=True,
)

_T = {
    "max_jitter_ms": typer.Option(None, "--max-jitter-ms", help="Verdict: jitter (±ms) at most this (0.8)."),
    "max_tail_ms": typer.Option(None, "--max-tail-ms", help="Verdict: p99 - p50 (ms) at most this (off)."),
    "leak_floor": typer.Option(None, "--leak-floor", help="Verdict: leak floor per hour, e.g. 1MiB (1MiB)."),
    "max_errors": typer.Option(None, "--max-errors", help="Verdict: errors + timeouts at most this (0)."),
    "max_lost": typer.Option(None, "--max-lost", help="Verdict: lost requests at most this (0)."),
    "max_fragmentation": typer.Option(None, "--max-fragmentation", help="Verdict: pool fragmentation (0.5)."),
}


def _thresholds(base: dict | None, **given) -> dict:
    from veo_edge.soak.units import parse_size

    out = dict(base or {})
    if given.get("leak_floor") is not None:
        out["leak_floor_bytes_per_h"] = parse_size(given.pop("leak_floor"), "--leak-floor")
    given.pop("leak_floor", None)
    out.update({k: v for k, v in given.items() if v is not None})
    return out


def _finish(run_dir: Path, thresholds: dict | None, as_json: bool) -> None:
    from veo_edge.soak.config import Thresholds
    from veo_edge.soak.report import write_report
    from veo_edge.soak.verdict import outcome

    th = Thresholds.from_dict(thresholds) if thresholds is not None else None
    report = write_report(run_dir, th)
    if as_json:
        print_json({k: v for k, v in report.items() if k not in ("windows", "events")})
    else:
        out = console()
        v = report["verdict"]
        for c in v["checks"]:
            word = outcome(c)
            mark = {"skipped": "[yellow]skipped[/]", "pass": "[green]pass[/]"}.get(
                word, f"[bold red]{word}[/]"
            )
            out.print(f"  {mark} {c['name']}: {c['detail']}", soft_wrap=True)
        out.print(
            f"soak {'[green]PASS[/]' if v['pass'] else '[bold red]FAIL[/]'}: report in {run_dir / 'report.md'} "
            f"(report.json, {len(report['plots'])} plots)"
        )
    if not report["verdict"]["pass"]:
        raise typer.Exit(VERDICT_FAIL)


@app.command("run")
def run(
    build_dir: Path = typer.Argument(None, help="A build directory (the runtime runs in this process)."),
    url: str = typer.Option(
        None,
        "--url",
        help="A running server instead: http://127.0.0.1:8000, or its gRPC port grpc://127.0.0.1:8001.",
    ),
    model_name: str = typer.Option(None, "--model-name", help="Model on the server (default: its only one)."),
    metrics_url: str = typer.Option(
        None,
        "--metrics-url",
        help="The server's Prometheus metrics, for its memory, faults and fallbacks (default: URL/metrics "
        "over HTTP; over gRPC none, e.g. http://127.0.0.1:8002/metrics).",
    ),
    duration: str = typer.Option(None, "--duration", "-d", help="How long: 30s, 10m, 72h, 1h30m."),
    rate: float = typer.Option(
        None,
        "--rate",
        help="Open loop: requests per second (fixed arrivals; latency from the scheduled send; arrivals "
        "the client cannot send are counted as not sent and fail the run).",
    ),
    concurrency: int = typer.Option(None, "--concurrency", "-c", help="Closed loop: clients (default 1)."),
    batch: int = typer.Option(1, "--batch", help="Samples per request."),
    out: Path = typer.Option(None, "--out", "-o", help="Run directory (new; default ./soak-DATE-TIME)."),
    resume: Path = typer.Option(None, "--resume", help="Continue the run in this directory."),
    window: str = typer.Option("5s", "--window", help="Latency window (histogram, p50/p99 per window)."),
    sample_interval: str = typer.Option("1s", "--sample-interval", help="Resource sampling interval."),
    warmup: str = typer.Option(None, "--warmup", help="Warm-up left out of fits (10% of the run, <= 10m)."),
    timeout: str = typer.Option(
        "30s",
        "--timeout",
        help="A request without an answer by then (open loop: counted from its scheduled send) is a timeout.",
    ),
    backend: str = typer.Option("auto", "--backend", "-b", help="In-process backend: auto, onnxruntime, ..."),
    policy: str = typer.Option(
        None, "--policy", help="In-process fallback order, e.g. onnxruntime,openvino."
    ),
    chaos: str = typer.Option(
        None,
        "--chaos",
        help="Faults for the runtime: a schedule such as 'oom every 10m, device_lost once at 30m', "
        'or VEO_EDGE_FAULTS JSON, e.g. \'{"onnxruntime": {"every_nth": 500}}\'.',
    ),
    recover_interval: str = typer.Option(
        None,
        "--recover-interval",
        help="After a fault, try the backends ahead of the active one again, and re-warm a standby whose "
        "warm-up failed, this often (default and off: never); one that fails again waits twice as long "
        "each time, up to 8 intervals.",
    ),
    threads: int = typer.Option(None, "--threads", min=0, help="CPU backend threads (0: the backend's)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the request input."),
    live: bool = typer.Option(True, "--live/--no-live", help="Live display on a terminal."),
    as_json: bool = typer.Option(False, "--json", help="Print report.json's summary."),
    max_jitter_ms: float = _T["max_jitter_ms"],
    max_tail_ms: float = _T["max_tail_ms"],
    leak_floor: str = _T["leak_floor"],
    max_errors: int = _T["max_errors"],
    max_lost: int = _T["max_lost"],
    max_fragmentation: float = _T["max_fragmentation"],
) -> None:
    """Drive load for a duration, record everything to RUN_DIR/soak.db, end with report + verdict."""
    import logging
    import time

    from veo_edge.errors import UsageError
    from veo_edge.soak.config import SoakConfig, require_dependencies

    require_dependencies(url=url is not None or resume is not None)
    from veo_edge.soak import run as soak_run
    from veo_edge.soak.units import parse_duration

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if resume is not None:
        extra = [
            n
            for n, v in (
                ("BUILD_DIR", build_dir),
                ("--url", url),
                ("--metrics-url", metrics_url),
                ("--duration", duration),
                ("--out", out),
            )
            if v
        ]
        if extra:
            raise UsageError(f"--resume continues a run with its own settings; drop {', '.join(extra)}")
        soak_run.resume(resume, live=live)
        _finish(resume, None, as_json)
        return
    if duration is None:
        raise UsageError("--duration is required, e.g. --duration 72h (or --resume RUN_DIR)")
    faults = None
    if chaos is not None:
        from veo_edge.soak.chaos import parse_chaos

        faults = parse_chaos(chaos)  # a schedule in human units or VEO_EDGE_FAULTS JSON, checked now
    config = SoakConfig(
        duration_s=parse_duration(duration, "--duration"),
        build_dir=str(build_dir.resolve()) if build_dir is not None else None,
        url=url,
        model_name=model_name,
        metrics_url=metrics_url,
        rate=rate,
        concurrency=concurrency,
        batch=batch,
        window_s=parse_duration(window, "--window"),
        sample_s=parse_duration(sample_interval, "--sample-interval"),
        warmup_s=parse_duration(warmup, "--warmup", allow_zero=True) if warmup is not None else None,
        timeout_s=parse_duration(timeout, "--timeout"),
        backend=backend,
        policy=[p.strip() for p in policy.split(",")] if policy else None,
        chaos=faults,
        recover_interval_s=parse_duration(recover_interval, "--recover-interval")
        if recover_interval and recover_interval.strip().lower() != "off"
        else None,
        threads=threads,
        seed=seed,
        thresholds=_thresholds(
            None,
            max_jitter_ms=max_jitter_ms,
            max_tail_ms=max_tail_ms,
            leak_floor=leak_floor,
            max_errors=max_errors,
            max_lost=max_lost,
            max_fragmentation=max_fragmentation,
        ),
    )
    if build_dir is not None:
        from veo_edge.builddir import BuildDir

        BuildDir.open(build_dir)  # a clear error before the run directory is made
    short = config.too_short()
    if short:  # a smoke run may want only errors and fallbacks: said up front, not refused
        console(stderr=True).print(f"warning: {short}", markup=False, soft_wrap=True)
    run_dir = out or Path(time.strftime("soak-%Y%m%d-%H%M%S"))
    warn = console(stderr=True)
    soak_run.start(config, run_dir, live=live, warn=lambda note: warn.print(f"warning: {note}", markup=False))
    _finish(run_dir, None, as_json)


@app.command("report")
def report(
    run_dir: Path = typer.Argument(..., help="A run directory written by `veo-edge soak`."),
    as_json: bool = typer.Option(False, "--json", help="Print report.json's summary."),
    max_jitter_ms: float = _T["max_jitter_ms"],
    max_tail_ms: float = _T["max_tail_ms"],
    leak_floor: str = _T["leak_floor"],
    max_errors: int = _T["max_errors"],
    max_lost: int = _T["max_lost"],
    max_fragmentation: float = _T["max_fragmentation"],
) -> None:
    """(Re)write RUN_DIR's report.json, report.md and plots; exit 0 on pass, 50 on fail."""
    from veo_edge.soak.config import require_dependencies
    from veo_edge.soak.store import RunStore

    require_dependencies()
    store = RunStore.open(run_dir)  # a clear error for a missing, foreign or corrupt run directory
    base = store.config.get("thresholds")
    store.close()
    given = dict(
        max_jitter_ms=max_jitter_ms,
        max_tail_ms=max_tail_ms,
        leak_floor=leak_floor,
        max_errors=max_errors,
        max_lost=max_lost,
        max_fragmentation=max_fragmentation,
    )
    _finish(run_dir, _thresholds(base, **given), as_json)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="soak")

"""A soak run: drive the load, sample at a fixed interval, commit everything as it comes, end with a
report. ``start`` begins a run in a new directory; ``resume`` continues one (after a SIGKILL, a crash
or SIGINT) up to its full duration. SIGINT and SIGTERM end the current segment cleanly: every issued
request is answered, everything is committed and the report is written."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.errors import RunDirError, UsageError
from veo_edge.soak.config import SoakConfig
from veo_edge.soak.live import Progress
from veo_edge.soak.load import LoadDriver, Recorder
from veo_edge.soak.store import RunStore

log = logging.getLogger("veo_edge.soak")


class RunClock:
    """The run's time line in seconds: the segment's offset until the segment starts, then counting on
    monotonic time. Windows, samples, events and the chaos schedule (the runtime's fault clock) read it,
    so an injected fault and its record agree on the moment, and a resumed run keeps its schedule."""

    def __init__(self, offset: float) -> None:
        self.offset = offset
        self._origin: float | None = None

    def start(self) -> float:
        self._origin = time.monotonic()
        return self._origin

    def __call__(self) -> float:
        if self._origin is None:
            return self.offset
        return self.offset + (time.monotonic() - self._origin)


def _target(config: SoakConfig, clock: RunClock):
    from veo_edge.soak.servers import GrpcTarget, HttpTarget
    from veo_edge.soak.targets import InProcessTarget

    if config.url is not None:
        kind = GrpcTarget if config.kind == "grpc" else HttpTarget
        return kind(config.url, config.model_name, timeout_s=config.timeout_s, metrics_url=config.metrics_url)
    return InProcessTarget(
        Path(config.build_dir),
        backend=config.backend,
        policy=config.policy,
        faults=config.chaos,
        fault_clock=clock,
        recover_interval_s=config.recover_interval_s,
        timeout_s=config.timeout_s,
        threads=config.threads,
    )


def start(
    config: SoakConfig, run_dir: Path, *, live: bool = True, warn: Callable[[str], None] | None = None
) -> Path:
    """Run a new soak into ``run_dir`` (new or empty); returns the run directory. ``warn`` is told, before
    the run starts, what it will not measure (a server whose memory is not sampled)."""
    RunStore.check_new(run_dir)
    clock = RunClock(0.0)
    target = _target(config, clock)
    opened = target.open()  # an unreachable server or a bad build fails before the run directory exists
    try:
        _check_batch(config, target)
        if warn is not None and getattr(target, "memory_note", None):
            warn(target.memory_note)
        store = RunStore.create(run_dir, config.to_dict())
    except BaseException:
        target.close()
        raise
    try:
        _run_segment(store, config, live, target, opened, clock)
    finally:
        store.close()
    return Path(run_dir)


def _check_batch(config: SoakConfig, target: Any) -> None:
    """A ``--batch`` above the server's model's ``max_batch_size`` is refused before the run (every
    request would be answered 400)."""
    limit = getattr(target, "max_batch", None)
    if limit is not None and config.batch > limit:
        raise UsageError(
            f"--batch {config.batch} is more than model {target.model_name!r} takes per request "
            f"(its max_batch_size is {limit}); give --batch {limit} or less"
        )


def resume(run_dir: Path, *, live: bool = True) -> Path:
    """Continue the run in ``run_dir`` up to its full duration."""
    store = RunStore.open(run_dir)
    try:
        meta = store.meta()
        if meta.get("status") == "complete":
            raise RunDirError(
                f"the run in {run_dir} is complete; nothing to resume (`veo-edge soak report {run_dir}`)"
            )
        _refuse_if_running(store, run_dir)
        config = SoakConfig.from_dict(meta["config"])
        if store.recorded_until() >= config.duration_s:
            store.set_status("complete")
        else:
            clock = RunClock(store.recorded_until())  # where begin_segment puts the new segment
            target = _target(config, clock)
            _run_segment(store, config, live, target, target.open(), clock)
    finally:
        store.close()
    return Path(run_dir)


def _refuse_if_running(store: RunStore, run_dir: Path) -> None:
    import psutil

    for seg in store.rows("segments"):
        pid = seg["pid"]
        if seg["ended_wall"] is None and pid != os.getpid() and psutil.pid_exists(pid):
            try:
                alive = "soak" in " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                alive = False
            if alive:
                raise RunDirError(
                    f"the run in {run_dir} is still being written by process {pid}; stop it "
                    "(SIGINT or SIGTERM) before resuming"
                )


class _Stop:
    """SIGINT/SIGTERM set the reason; the main loop ends the segment cleanly."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.reason = signal.Signals(signum).name
        self.event.set()

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _run_segment(
    store: RunStore, config: SoakConfig, live: bool, target: Any, opened: tuple, clock: RunClock
) -> None:
    from veo_edge.soak.sampler import Sampler

    shape, dtype = opened
    try:
        rng = np.random.default_rng(config.seed)
        batch = rng.standard_normal((config.batch, *shape)).astype(dtype)
        segment, offset = store.begin_segment(os.getpid())
        store.add_event(offset, "segment", f"segment {segment} started at {offset:.1f} s (pid {os.getpid()})")
        store.commit()
        sampler = Sampler(target, in_process=config.url is None)
        recorder = Recorder()
        driver = LoadDriver(
            target, batch, recorder, rate=config.rate, concurrency=config.concurrency, workers=config.workers
        )
        title = f"veo-edge soak: {target.name} ({config.mode}, batch {config.batch})"
        with _Stop() as stop, Progress(config.duration_s, title, enabled=live) as progress:
            reason = _loop(store, config, sampler, recorder, driver, clock, stop, progress)
        sampler.close()
    finally:
        target.close()
    store.set_status("complete" if reason == "complete" else "stopped")
    log.info("soak segment ended: %s", reason)


def _loop(store, config, sampler, recorder, driver, clock, stop, progress) -> str:
    offset = clock.offset
    seg_start = clock.start()
    now = clock
    driver.start()
    window_start = offset
    window_due = offset + config.window_s
    last_fallbacks: int | None = 0 if config.url is None else None  # a server's counter runs on
    injected: dict[str, int] = {}  # chaos: faults injected so far, by rule
    next_tick = seg_start + config.sample_s
    live_stats: dict[str, Any] = {"ok": 0, "errors": 0}
    reason = "complete"
    while True:
        remaining = config.duration_s - now()
        if remaining <= 0:
            break
        wait = min(next_tick - time.monotonic(), remaining)
        if stop.event.wait(max(wait, 0.0)):
            reason = stop.reason or "stopped"
            break
        if time.monotonic() < next_tick:  # woke for the end of the run, not for a tick
            continue
        next_tick += config.sample_s
        t = now()
        last_fallbacks = _tick(store, sampler, t, last_fallbacks, live_stats, injected)
        if t >= window_due - config.sample_s / 2:  # on the planned grid: ticks drift by microseconds
            _close_window(store, recorder, window_start, t, live_stats)
            window_start = t
            window_due += config.window_s
        store.commit()
        progress.update(t, live_stats)
    in_flight = driver.stop(timeout=max(30.0, config.timeout_s * 2))
    t = now()
    _close_window(store, recorder, window_start, t, live_stats)
    _tick(store, sampler, t, last_fallbacks, live_stats, injected)
    if reason != "complete":
        store.add_event(
            t, "interrupted", f"{reason} at {t:.1f} s; `veo-edge soak --resume` continues the run"
        )
    if in_flight:
        store.add_event(t, "lost", f"{in_flight} requests still unanswered after the drain")
    store.end_segment(reason, in_flight)
    store.commit()
    progress.update(t, live_stats)
    return reason


def _tick(store, sampler, t, last_fallbacks, live_stats, injected) -> int | None:
    row = sampler.sample(t, time.time())
    for rule, n in ((row.get("extra") or {}).get("injected") or {}).items():
        if n > injected.get(rule, 0):
            store.add_event(t, "chaos", f"{n - injected.get(rule, 0)} injected fault(s): {rule}")
            injected[rule] = n
    store.add_sample(row)
    fb = row.get("fallbacks")
    if fb is not None and last_fallbacks is not None and fb > last_fallbacks:
        detail = f"{fb - last_fallbacks} fallback switch(es), now on {row.get('active_backend')}"
        store.add_event(t, "fallback", detail)
    live_stats.update(rss=row.get("rss"), fallbacks=fb)
    return fb if fb is not None else last_fallbacks


def _close_window(store, recorder, t0, t1, live_stats) -> None:
    row, messages = recorder.roll(t0, t1)
    store.add_window(row)
    for kind, message in messages:
        store.add_event(t1, kind, message)
    span = max(t1 - t0, 1e-9)
    live_stats["rate"] = row["ok"] / span
    live_stats["ok"] = live_stats.get("ok", 0) + row["ok"]
    live_stats["errors"] = live_stats.get("errors", 0) + row["errors"] + row["timeouts"]
    if row.get("p50_us") is not None:
        live_stats["p50_ms"] = row["p50_us"] / 1e3
        live_stats["p99_ms"] = row["p99_us"] / 1e3

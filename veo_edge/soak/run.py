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
from veo_edge.soak.load import LoadDriver, Recorder, Window
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
        if store.ran_s() >= config.duration_s - 1e-6:  # run time, not the drains recorded after it
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
        ran_s, issued = store.ran_s(), store.issued()  # what earlier segments ran and issued
        segment, offset = store.begin_segment(os.getpid())
        store.add_event(offset, "segment", f"segment {segment} started at {offset:.1f} s (pid {os.getpid()})")
        store.commit()
        sampler = Sampler(target, in_process=config.url is None)
        recorder = Recorder()
        driver = LoadDriver(
            target,
            batch,
            recorder,
            rate=config.rate,
            concurrency=config.concurrency,
            workers=config.workers,
            timeout_s=config.timeout_s,
        )
        title = f"veo-edge soak: {target.name} ({config.mode}, batch {config.batch})"
        with _Stop() as stop, Progress(config.duration_s, title, enabled=live) as progress:
            reason = _loop(store, config, sampler, recorder, driver, clock, stop, progress, (ran_s, issued))
        sampler.close()
    finally:
        target.close()
    store.set_status("complete" if reason == "complete" else "stopped")
    log.info("soak segment ended: %s", reason)


def _loop(store, config, sampler, recorder, driver, clock, stop, progress, done) -> str:
    """Ticks (samples, windows, commits) until the planned end or a stop signal, then stops issuing:
    arrivals still in the client's backlog are not sent, and the ticks go on while the requests in flight
    end (each within its timeout). The segment's run time (what counts toward ``--duration``) ends where
    it stopped issuing; its time line ends when the last request has. ``done``: the run time and
    arrivals of earlier segments; this one runs the rest."""
    offset = clock.offset
    ran_s, issued = done
    length = config.duration_s - ran_s
    state = _TickState(store, config, sampler, recorder, clock, progress, offset)
    state.baseline()  # the counters as they stand before this segment's first request
    seg_start = clock.start()
    state.next_tick = seg_start + config.sample_s
    driver.start(length, ran_s=ran_s, issued=issued)
    reason = "complete"
    end = seg_start + length
    while True:  # issuing
        wait = min(state.next_tick, end) - time.monotonic()
        if stop.event.wait(max(wait, 0.0)):
            reason = stop.reason or "stopped"
            break
        if time.monotonic() >= state.next_tick:  # the tick due at the end too: its window ends on time
            state.tick()
        if time.monotonic() >= end:
            break
    t_end = clock()
    driver.finish(at_end=reason == "complete")
    store.stopped_issuing(t_end)
    drain_until = time.monotonic() + config.timeout_s + 5.0  # every request ends within its timeout
    while driver.busy and time.monotonic() < drain_until:  # draining: windows go on covering the run
        time.sleep(min(max(state.next_tick - time.monotonic(), 0.0), 0.05))
        if time.monotonic() >= state.next_tick:
            state.tick()
    in_flight = driver.stop(timeout=0.1)
    t = clock()
    state.last(t)
    if t > t_end + 1e-3:
        store.add_event(t, "drained", f"{t - t_end:.1f} s after the end for the requests in flight")
    if reason != "complete":
        store.add_event(
            t, "interrupted", f"{reason} at {t_end:.1f} s; `veo-edge soak --resume` continues the run"
        )
    if in_flight:
        detail = f"{in_flight} requests still unanswered {config.timeout_s + 5:g} s after the end"
        store.add_event(t, "lost", detail)
    store.end_segment(reason, in_flight)
    store.commit()
    progress.update(t, state.live_stats)
    return reason


class _TickState:
    """What the ticks of one segment carry from one to the next: the window grid, the fallback and chaos
    counters, whether the server answered its last probe."""

    def __init__(self, store, config, sampler, recorder, clock, progress, offset) -> None:
        self.store, self.config, self.sampler, self.recorder = store, config, sampler, recorder
        self.clock, self.progress = clock, progress
        self.window = Window(offset)  # the open window, committed as it stands at every tick
        self.window_due = offset + config.window_s
        self.next_tick = 0.0  # set when the segment's clock starts
        self.last_fallbacks: int | None = 0 if config.url is None else None  # a server's counter runs on
        self.injected: dict[str, int] = {}  # chaos: faults injected so far, by rule
        self.live_stats: dict[str, Any] = {"ok": 0, "errors": 0}
        self.down: str | None = None  # why the server failed its last probe

    def tick(self) -> None:
        self.next_tick += self.config.sample_s
        t = self.clock()
        self._sample(t)
        # a window closes on the planned grid (ticks drift by µs); until then its row is rewritten
        self._gather(t, final=t >= self.window_due - self.config.sample_s / 2)
        self.store.commit()
        self.progress.update(t, self.live_stats)

    def baseline(self) -> None:
        """A sample at the segment's offset, before the load starts: a server's counters (faults, retries,
        switches) run on, so what the run saw is what grew from here to the sample after the drain."""
        self._sample(self.clock(), baseline=True)
        self.store.commit()

    def last(self, t: float) -> None:
        self._gather(t, final=True)
        self._sample(t)

    def _gather(self, t: float, final: bool) -> None:
        """The outcomes since the last tick into the open window, whose row is written as it stands
        (``final``: closed, with its percentiles, and the next window opened at ``t``)."""
        window, store, live = self.window, self.store, self.live_stats
        for kind, message in self.recorder.take_into(window):
            store.add_event(t, kind, message)
        row = window.row(t, summary=final)
        store.put_window(row, final)
        live["rate"] = row["ok"] / max(t - window.t0, 1e-9)
        live["ok"], live["errors"] = self.recorder.total_ok, self.recorder.total_errors
        live["not_sent"] = self.recorder.total_not_sent
        if row.get("p50_us") is not None:
            live["p50_ms"], live["p99_ms"] = row["p50_us"] / 1e3, row["p99_us"] / 1e3
        if final:
            for kind, message in window.not_sent_messages():
                store.add_event(t, kind, message)
            window.start(t)
            self.window_due += self.config.window_s

    def _sample(self, t: float, baseline: bool = False) -> None:
        live = _probe(self.store, self.sampler.target, t, self)
        self.last_fallbacks = _tick(
            self.store, self.sampler, t, self.last_fallbacks, self.live_stats, self.injected, live, baseline
        )


def _probe(store, target, t: float, state: _TickState) -> bool | None:
    """The server's liveness at ``t`` (None in-process); a change is an event."""
    alive = getattr(target, "alive", None)
    if alive is None:
        return None
    why = alive()
    if why is not None and state.down is None:
        store.add_event(t, "server_down", f"the server stopped answering its health probe: {why}")
    elif why is None and state.down is not None:
        store.add_event(t, "server_up", "the server answers its health probe again")
    state.down = why
    return why is None


def _tick(store, sampler, t, last_fallbacks, live_stats, injected, live=None, baseline=False) -> int | None:
    row = sampler.sample(t, time.time())
    extra = row.get("extra") or {}
    extra["db_bytes"] = store.logical_bytes()  # the disk rate is fitted on this, not on the file size
    if live is not None:
        extra["live"] = live
    if baseline:  # taken before the segment's load: the report counts from it
        extra["baseline"] = True
    row["extra"] = extra
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

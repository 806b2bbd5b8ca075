"""What a soak run is asked to do, and the verdict's thresholds; stored in the run directory so that
``--resume`` and ``soak report`` read the run's own settings."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from veo_edge.errors import UsageError
from veo_edge.soak.units import MiB

#: import name -> distribution of what `veo-edge soak` needs (the `soak` extra)
REQUIRED = {"hdrh": "hdrhistogram", "psutil": "psutil", "scipy": "scipy", "matplotlib": "matplotlib"}


def require_dependencies(url: bool = False) -> None:
    """A :class:`UsageError` naming what to install when the `soak` extra is missing."""
    import importlib.util

    needed = {**REQUIRED, **({"prometheus_client": "prometheus-client"} if url else {})}
    missing = sorted(dist for mod, dist in needed.items() if importlib.util.find_spec(mod) is None)
    if missing:
        raise UsageError(
            f"veo-edge soak needs {', '.join(missing)}, which are not installed; "
            "install them with `pip install 'veo-edge[soak]'`"
        )


@dataclass
class Thresholds:
    """Verdict thresholds; the defaults are the design targets (a 72-hour run)."""

    max_jitter_ms: float = 0.8  # ± half-range of per-window p50 after warm-up (README: jitter)
    max_tail_ms: float | None = None  # p99 - p50 over the run after warm-up; None: reported only
    leak_floor_bytes_per_h: float = 1 * MiB  # pass when the leak interval contains 0 or its top is below
    max_errors: int = 0  # errors + timeouts
    max_lost: int = 0  # issued but never answered (clean segments)
    max_fragmentation: float = 0.5  # pool 1 - largest/free at the end (median of the last tenth)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> Thresholds:
        raw = dict(raw or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise UsageError(f"unknown threshold(s) {unknown}; choose from: {', '.join(sorted(known))}")
        return cls(**raw)


@dataclass
class SoakConfig:
    duration_s: float
    build_dir: str | None = None
    url: str | None = None
    model_name: str | None = None
    metrics_url: str | None = None  # the server's Prometheus text (default: URL/metrics over HTTP)
    rate: float | None = None
    concurrency: int | None = None
    batch: int = 1
    window_s: float = 5.0
    sample_s: float = 1.0
    warmup_s: float | None = None  # None: 10 % of the duration, at most 10 minutes
    timeout_s: float = 30.0
    backend: str = "auto"
    policy: list[str] | None = None
    chaos: dict[str, Any] | None = None  # a fault-injection spec (VEO_EDGE_FAULTS form) for the runtime
    recover_interval_s: float | None = None
    threads: int | None = None
    workers: int = 32
    seed: int = 0
    thresholds: Thresholds = field(default_factory=Thresholds)

    def __post_init__(self) -> None:
        if (self.build_dir is None) == (self.url is None):
            raise UsageError(
                "give a BUILD_DIR (in-process) or --url URL (a server), not both and not neither"
            )
        if self.rate is not None and self.concurrency is not None:
            raise UsageError(
                "--rate (open loop) and --concurrency (closed loop) exclude each other; pick one"
            )
        if self.rate is None and self.concurrency is None:
            self.concurrency = 1
        if self.rate is not None and not self.rate > 0:
            raise UsageError(f"--rate {self.rate} must be > 0 requests per second")
        if self.concurrency is not None and self.concurrency < 1:
            raise UsageError(f"--concurrency {self.concurrency} must be >= 1")
        if self.batch < 1:
            raise UsageError(f"--batch {self.batch} must be >= 1")
        if not 0 < self.sample_s <= self.window_s:
            raise UsageError(
                f"--sample-interval {self.sample_s} s must be > 0 and at most the --window {self.window_s} s"
            )
        if self.metrics_url is not None:
            if self.url is None:
                raise UsageError(
                    "--metrics-url goes with --url (a server); an in-process run samples its own memory"
                )
            if not self.metrics_url.startswith("http://"):
                raise UsageError(
                    f"--metrics-url {self.metrics_url!r} is not an http:// URL; expected e.g. "
                    "http://127.0.0.1:8002/metrics (the server's --metrics-port)"
                )
        if self.url is not None and self.chaos:
            raise UsageError(
                "--chaos injects faults into the runtime in this process; against a server start it with "
                "VEO_EDGE_FAULTS=... instead (the soak counts its fallbacks from /metrics)"
            )
        if isinstance(self.thresholds, dict):
            self.thresholds = Thresholds.from_dict(self.thresholds)

    @property
    def kind(self) -> str:
        """What the run drives: ``in-process``, or a server over ``http`` or ``grpc``."""
        if self.url is None:
            return "in-process"
        return "grpc" if self.url.startswith("grpc://") else "http"

    @property
    def metrics_source(self) -> str | None:
        """Where a server's Prometheus metrics are read: --metrics-url, else URL/metrics over HTTP; none
        over gRPC (it carries no /metrics) or in-process (this process samples itself)."""
        if self.metrics_url is not None or self.kind != "http":
            return self.metrics_url
        return f"{self.url}/metrics"

    @property
    def samples_memory(self) -> bool:
        """Whether the run samples the memory the leak check fits: in-process its own, a server's from
        its metrics."""
        return self.kind == "in-process" or self.metrics_source is not None

    @property
    def warmup(self) -> float:
        return self.warmup_s if self.warmup_s is not None else min(0.1 * self.duration_s, 600.0)

    def too_short(self) -> str | None:
        """Why this duration cannot give every check a value, or None: after the warm-up the jitter needs
        ``MIN_JITTER_WINDOWS`` whole ``--window``s and the leak fit ``MIN_FIT_SAMPLES`` resource samples
        (without them those checks read skipped)."""
        from veo_edge.soak.fits import MIN_FIT_SAMPLES, MIN_JITTER_WINDOWS
        from veo_edge.soak.units import format_duration as fmt

        left = self.duration_s - self.warmup
        need = max(
            MIN_JITTER_WINDOWS * self.window_s,
            MIN_FIT_SAMPLES * self.sample_s if self.samples_memory else 0.0,
        )
        if left >= need:
            return None
        if self.warmup_s is not None:
            least = need + self.warmup_s
        else:  # the default warm-up is 10 % of the run, at most 10 minutes
            least = need / 0.9 if need / 0.9 <= 6000 else need + 600
        least = float(math.ceil(least))
        return (
            f"--duration {fmt(self.duration_s)} leaves {fmt(max(left, 0.0))} after the {fmt(self.warmup)} "
            f"warm-up, but the jitter needs {MIN_JITTER_WINDOWS} whole {fmt(self.window_s)} windows"
            + (
                f" and the leak fit {MIN_FIT_SAMPLES} samples at {fmt(self.sample_s)}"
                if self.samples_memory
                else ""
            )
            + f": those checks will read skipped; give every check a value with at least {fmt(least)}, or "
            + (
                "shorten --window, --sample-interval or --warmup"
                if self.samples_memory
                else "shorten --window or --warmup"
            )
        )

    @property
    def mode(self) -> str:
        return (
            f"open loop {self.rate:g} req/s"
            if self.rate is not None
            else f"closed loop {self.concurrency} clients"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SoakConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

"""What ``veo-edge serve`` was asked for: addresses, limits, timeouts, extensions and access, one
:class:`ServeOptions` the service and the transports read (the command line fills it in)."""

from __future__ import annotations

from dataclasses import dataclass, field

from veo_edge.serve.control import AccessPolicy
from veo_edge.serve.transport import Limits


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None
    limits: Limits = field(default_factory=Limits)
    #: an infer request not answered within this many seconds gets a 504
    infer_timeout_s: float = 60.0
    drain_timeout_s: float = 30.0
    #: while not ready after a failure, re-check (recover, canary) this often
    recheck_interval_s: float = 1.0
    #: KServe v2 gRPC port (Triton's 8001; 0: any free port; None: no gRPC)
    grpc_port: int | None = None
    #: a separate Prometheus port (Triton's 8002; 0: any free port; None: only /metrics on the HTTP port)
    metrics_port: int | None = None
    #: before serving (and after a repository load), warm every batch size: ``Runtime.warm_up``
    warmup: bool = False
    #: Triton's shared-memory extension (``serve --shared-memory``; see :mod:`veo_edge.serve.shm`)
    shared_memory: bool = False
    #: model control mode and the API groups behind a bearer token (:mod:`veo_edge.serve.control`)
    access: AccessPolicy = field(default_factory=AccessPolicy)
    #: a lone request runs on the event loop's thread while the model's lone requests take at most this
    #: many ms, the median of the last 5 (0: never; :mod:`veo_edge.serve.alone`)
    lone_max_ms: float = 50.0

"""``/metrics``: Prometheus text from the runtime's cumulative counters, read at scrape time.

Names follow Triton's where Triton has one (``nv_inference_request_success``, ``..._duration_us``,
``nv_gpu_memory_used_bytes``; exposed untyped so that the names stay exactly Triton's, without the
``_total`` suffix prometheus-client adds to counters); the rest are ``veo_edge_*``. The request path
counts only the server's own outcomes (HTTP responses, rejections, each request's times: Triton's
request-level series); the rest is read from the runtime at scrape time, one ``runtime.stats()``.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from veo_edge.serve.protocol import ModelSpec

_NVML_LOCK = threading.Lock()


_IDLE_STATS: dict[str, Any] = {
    "batch_size_counts": {},
    "close_reasons": {},
    "batches": 0,
    "pending": 0,
    "fallback_switches": 0,
    "faults": {},
    "retries": {},
    "active_backend": None,
    "standby_backend": None,
    "memory_pool": None,
}


class RequestTimes:
    """Inference requests as Triton counts them, one per request whatever its batch size: those answered
    with their cumulative duration in the server, the time their samples waited in the queue and the
    compute time of the batches they ran in (a request's slowest sample each), and those that failed
    once their samples were submitted (the backend, or the inference timeout)."""

    def __init__(self) -> None:
        self.success = self.failure = 0
        self.request_ns = self.queue_ns = self.compute_ns = 0

    def answered(self, request_ns: int, timings: list[tuple[int, int]]) -> None:
        self.success += 1
        self.request_ns += request_ns
        if timings:
            self.queue_ns += max(q for q, _ in timings)
            self.compute_ns += max(c for _, c in timings)


#: the help of ``veo_edge_infer_requests``, per model and in a model set's own collector
INFER_REQUESTS_HELP = (
    "Inference requests by protocol and outcome, as an HTTP status (200: answered; 400: refused unparsed)"
)


class HttpCounters:
    """What the transports saw: HTTP responses by route name (never the raw path) and status, rejections
    by reason, and inference requests by protocol (http, grpc) and outcome (the HTTP status), and their
    times (:class:`RequestTimes`)."""

    def __init__(self) -> None:
        self.responses: Counter[tuple[str, int]] = Counter()
        self.infer_rejected: Counter[str] = Counter()  # reason -> count: INVALID, REJECTED (overload), ...
        self.infer_requests: Counter[tuple[str, int]] = Counter()  # (protocol, status) -> requests
        #: (protocol, status) -> inference requests refused before a model of the server was known (a
        #: message that did not decode, an unknown model): counted with model and version ""
        self.infer_unrouted: Counter[tuple[str, int]] = Counter()
        self.times = RequestTimes()


class _Nvml:
    """GPU memory through NVML, where NVML exists; absent otherwise (checked once, lazily)."""

    def __init__(self) -> None:
        self.handles: list[Any] | None = None
        self.nvml: Any = None

    def memory(self) -> list[tuple[str, int, int]]:
        with _NVML_LOCK:
            if self.handles is None:
                self.handles = []
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    self.nvml = pynvml
                    self.handles = [
                        pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
                    ]
                except Exception:  # no driver, no library, no device: no GPU metrics
                    self.handles = []
        out = []
        for h in self.handles:
            try:
                uuid = self.nvml.nvmlDeviceGetUUID(h)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
                out.append((uuid if isinstance(uuid, str) else uuid.decode(), int(mem.used), int(mem.total)))
            except Exception:  # a device lost between scrapes
                continue
        return out


class ServeCollector:
    """A prometheus-client collector over a runtime, the model spec and the HTTP counters.

    ``runtime`` is a callable returning the runtime now serving (``None`` while the model is unloaded)."""

    def __init__(self, runtime: Any, model: ModelSpec, http: HttpCounters, readiness: Any) -> None:
        self.runtime_of = runtime if callable(runtime) else (lambda: runtime)
        self.model = model
        self.http = http
        self.readiness = readiness  # () -> bool
        self.nvml = _Nvml()

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

        runtime = self.runtime_of()
        s = runtime.stats() if runtime is not None else _IDLE_STATS
        ml = ["model", "version"]
        mv = [self.model.name, self.model.version]

        def untyped(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
            m = Metric(name, doc, "unknown")
            m.add_sample(name, {"model": mv[0], "version": mv[1], **(labels or {})}, value)
            return m

        times = self.http.times
        yield untyped(
            "nv_inference_request_success",
            "Successful inference requests (one per request, whatever its batch size)",
            times.success,
        )
        fail = Metric("nv_inference_request_failure", "Failed inference requests, by reason", "unknown")
        fail.add_sample(
            "nv_inference_request_failure",
            {"model": mv[0], "version": mv[1], "reason": "BACKEND"},
            times.failure,
        )
        for reason, n in sorted(self.http.infer_rejected.items()):
            fail.add_sample(
                "nv_inference_request_failure", {"model": mv[0], "version": mv[1], "reason": reason}, n
            )
        yield fail
        sizes = {int(k): int(v) for k, v in (s.get("batch_size_counts") or {}).items()}
        yield untyped(
            "nv_inference_count", "Inferences performed (samples)", sum(k * v for k, v in sizes.items())
        )
        yield untyped("nv_inference_exec_count", "Model executions (batches)", s["batches"])
        yield untyped(
            "nv_inference_request_duration_us",
            "Cumulative duration of successful requests in the server",
            times.request_ns / 1e3,
        )
        yield untyped(
            "nv_inference_queue_duration_us",
            "Cumulative time successful requests waited in the queue",
            times.queue_ns / 1e3,
        )
        yield untyped(
            "nv_inference_compute_infer_duration_us",
            "Cumulative compute time of the batches successful requests ran in",
            times.compute_ns / 1e3,
        )
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count", "Requests waiting in the queue", labels=ml
        )
        pending.add_metric(mv, s.get("pending", 0))
        yield pending

        batch = CounterMetricFamily(
            "veo_edge_batch_size", "Executed batches by batch size", labels=[*ml, "batch_size"]
        )
        for size, n in sorted(sizes.items()):
            batch.add_metric([*mv, str(size)], n)
        yield batch
        closed = CounterMetricFamily(
            "veo_edge_batches_closed",
            "Batches by why they closed: full, nothing_expected (nothing more on its way) or deadline "
            "(the queue delay ran out)",
            labels=[*ml, "reason"],
        )
        for reason, n in sorted((s.get("close_reasons") or {}).items()):
            closed.add_metric([*mv, reason], n)
        yield closed
        active = GaugeMetricFamily(
            "veo_edge_active_backend", "1 for the backend now serving", labels=[*ml, "backend"]
        )
        if s.get("active_backend"):
            active.add_metric([*mv, str(s["active_backend"])], 1)
        yield active
        skipped = GaugeMetricFamily(
            "veo_edge_backend_skipped",
            "1 for each backend the runtime passed over, with why (the latest reason for each)",
            labels=[*ml, "backend", "reason"],
        )
        state = runtime.state.to_dict() if hasattr(runtime, "state") else {}
        for name, why in {x["backend"]: x["reason"] for x in state.get("skipped") or []}.items():
            skipped.add_metric([*mv, name, why[:300]], 1)
        yield skipped
        precision = GaugeMetricFamily(
            "veo_edge_active_precision",
            "1 for the precision the active backend computes at (f32, bf16, int8, fp16)",
            labels=[*ml, "backend", "precision"],
        )
        described = runtime.describe() if runtime is not None and s.get("active_backend") else {}
        if described.get("precision"):
            precision.add_metric([*mv, str(s["active_backend"]), str(described["precision"])], 1)
        yield precision
        compiles = CounterMetricFamily(
            "veo_edge_openvino_batches",
            "OpenVINO ADAPTIVE: batches run on its batch-1 LATENCY compile (a lone sample), its batch-1 "
            "THROUGHPUT streams (a sample beside others) and its dynamic-batch streams",
            labels=[*ml, "compile"],
        )
        for compile_, n in sorted((described.get("adaptive_runs") or {}).items()):
            compiles.add_metric([*mv, compile_], n)
        yield compiles
        if isinstance(described.get("infer_requests"), int):
            requests = GaugeMetricFamily(
                "veo_edge_openvino_infer_requests",
                "OpenVINO infer requests created (each keeps the memory of its batch size); "
                "constant after the warm-up",
                labels=ml,
            )
            requests.add_metric(mv, described["infer_requests"])
            yield requests
        yield from _fault_metrics(s, ml, mv)
        requests = CounterMetricFamily(
            "veo_edge_infer_requests",
            INFER_REQUESTS_HELP,
            labels=[*ml, "protocol", "code"],
        )
        for (protocol, code), n in sorted(self.http.infer_requests.items()):
            requests.add_metric([*mv, protocol, str(code)], n)
        add_unrouted(requests, self.http)
        yield requests
        ready = GaugeMetricFamily(
            "veo_edge_ready", "1 when the model is ready (backend up, canary matched)", labels=ml
        )
        ready.add_metric(mv, 1 if self.readiness() else 0)
        yield ready
        pool = s.get("memory_pool") or {}
        if isinstance(pool.get("reservation_factor"), (int, float)):
            factor = GaugeMetricFamily(
                "veo_edge_memory_pool_reservation_factor",
                "Memory pool reservation, as a multiple of the max-batch activation + I/O need",
                labels=ml,
            )
            factor.add_metric(mv, pool["reservation_factor"])
            yield factor
        for key, value in sorted(pool.items()):
            if key == "reservation_factor":
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                g = GaugeMetricFamily(f"veo_edge_memory_pool_{key}", f"Memory pool: {key}", labels=ml)
                g.add_metric(mv, value)
                yield g
        http = CounterMetricFamily(
            "veo_edge_http_responses", "HTTP responses by route and status", labels=["route", "code"]
        )
        for (endpoint, code), n in sorted(self.http.responses.items()):
            http.add_metric([endpoint, str(code)], n)
        yield http
        gpus = self.nvml.memory()
        if gpus:
            used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU memory used", labels=["gpu_uuid"])
            total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU memory total", labels=["gpu_uuid"])
            for uuid, u, t in gpus:
                used.add_metric([uuid], u)
                total.add_metric([uuid], t)
            yield used
            yield total


def _fault_metrics(s: dict[str, Any], ml: list[str], mv: list[str]):
    """Faults by backend and kind, retries by the backend they ran on and outcome, switches and recoveries,
    standby."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    faults = CounterMetricFamily(
        "veo_edge_backend_faults",
        "Failed backend calls by backend and kind (oom, device_lost, backend; wrong_answer: a canary answered "
        "wrongly that cost the backend), warm-ups included",
        labels=[*ml, "backend", "kind"],
    )
    for backend, kinds in sorted((s.get("faults") or {}).items()):
        for kind, n in sorted(kinds.items()):
            faults.add_metric([*mv, backend, kind], n)
    yield faults
    retries = CounterMetricFamily(
        "veo_edge_retries",
        "Failed batches re-run, by the backend they were re-run on and outcome (ok, failed)",
        labels=[*ml, "backend", "outcome"],
    )
    for backend, outcomes in sorted((s.get("retries") or {}).items()):
        for outcome, n in sorted(outcomes.items()):
            retries.add_metric([*mv, backend, outcome], n)
    yield retries
    switches = CounterMetricFamily(
        "veo_edge_fallback_switches", "Switches of traffic away from a failing backend", labels=ml
    )
    switches.add_metric(mv, s.get("fallback_switches", 0))
    yield switches
    recoveries = CounterMetricFamily(
        "veo_edge_fallback_recoveries", "Moves of traffic back to a backend usable again", labels=ml
    )
    recoveries.add_metric(mv, s.get("fallback_recoveries", 0))
    yield recoveries
    standby = GaugeMetricFamily(
        "veo_edge_standby_backend",
        "1 for the warm standby that takes retries and switches",
        labels=[*ml, "backend"],
    )
    if s.get("standby_backend"):
        standby.add_metric([*mv, str(s["standby_backend"])], 1)
    yield standby


def infer_requests_family(counters: HttpCounters):
    """``veo_edge_infer_requests`` with only the refusals no model was known for (a model set's own)."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(
        "veo_edge_infer_requests",
        INFER_REQUESTS_HELP,
        labels=["model", "version", "protocol", "code"],
    )
    add_unrouted(family, counters)
    return family


def add_unrouted(family: Any, counters: HttpCounters) -> None:
    """The requests refused before a model was known, under model and version "" (never the name a
    client sent: the label set stays bounded)."""
    for (protocol, code), n in sorted(counters.infer_unrouted.items()):
        family.add_metric(["", "", protocol, str(code)], n)


def make_registry(collector: ServeCollector):
    """A private registry (never the global one): the serve collector plus process metrics (RSS, CPU)."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry


def render(registry: Any) -> tuple[bytes, str]:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST

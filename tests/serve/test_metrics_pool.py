"""The memory pool's reservation factor on /metrics (a gauge of its own) next to the pool's stats."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from veo_edge.serve.metrics import HttpCounters, ServeCollector
from veo_edge.serve.protocol import ModelSpec


class _Stats:
    """What Runtime.stats() reports while the TensorRT runner serves (the collector is under test)."""

    def __init__(self, pool):
        self.pool = pool

    def stats(self):
        return {
            "requests_success": 0, "requests_failure": 0, "batches": 0, "batch_size_counts": {},
            "request_us_total": 0, "queue_us_total": 0, "compute_us_total": 0, "pending": 0,
            "fallback_switches": 0, "active_backend": "tensorrt", "memory_pool": self.pool,
        }  # fmt: skip

    def describe(self):
        return {"backend": "tensorrt", "precision": "fp16"}


def _scrape(pool) -> str:
    spec = ModelSpec(name="vit-nano", inputs=(), outputs=(), max_batch=8)
    registry = CollectorRegistry()
    registry.register(ServeCollector(_Stats(pool), spec, HttpCounters(), lambda: True))
    return generate_latest(registry).decode()


def test_the_reservation_factor_is_its_own_gauge():
    text = _scrape({"capacity": 1 << 30, "overflow_bytes": 0, "fence_waits": 3, "reservation_factor": 4.0})
    assert "# TYPE veo_edge_memory_pool_reservation_factor gauge" in text
    assert 'veo_edge_memory_pool_reservation_factor{model="vit-nano",version="1"} 4.0' in text
    assert 'veo_edge_memory_pool_fence_waits{model="vit-nano",version="1"} 3.0' in text
    assert text.count("veo_edge_memory_pool_reservation_factor{") == 1


def test_no_pool_no_gauge():
    assert "reservation_factor" not in _scrape(None)


def test_why_a_backend_was_passed_over_is_on_metrics():
    """A fallback says why on /metrics too (the runtime state's latest reason per skipped backend)."""

    class Skipped(_Stats):
        state = SimpleNamespace(
            to_dict=lambda: {
                "skipped": [
                    {"backend": "tensorrt", "reason": "old reason"},
                    {"backend": "tensorrt", "reason": "tensorrt is not installed"},
                ]
            }
        )

    spec = ModelSpec(name="vit-nano", inputs=(), outputs=(), max_batch=8)
    registry = CollectorRegistry()
    registry.register(ServeCollector(Skipped(None), spec, HttpCounters(), lambda: True))
    text = generate_latest(registry).decode()
    assert (
        'veo_edge_backend_skipped{backend="tensorrt",model="vit-nano",reason="tensorrt is not installed",'
        'version="1"} 1.0' in text
    )
    assert "old reason" not in text

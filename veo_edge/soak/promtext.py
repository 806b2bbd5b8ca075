"""What the soak reads from a server's Prometheus ``/metrics`` (the names ``veo-edge serve`` and Triton
export), parsed with ``prometheus_client``'s text parser."""

from __future__ import annotations

from typing import Any

_POOL = "veo_edge_memory_pool_"


def scrape(text: str) -> dict[str, Any]:
    """The server's RSS, fds, fallbacks, batches, active backend, GPU memory and pool stats."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    out: dict[str, Any] = {}
    pool: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
            if s.name == "veo_edge_active_backend" and s.value == 1:
                out["active_backend"] = s.labels.get("backend")
            if s.name.startswith(_POOL):
                pool[s.name[len(_POOL) :]] = s.value
    fields = {
        "rss": "process_resident_memory_bytes",
        "fds": "process_open_fds",
        "fallbacks": "veo_edge_fallback_switches_total",
        "batches": "nv_inference_exec_count",
        "gpu_used": "nv_gpu_memory_used_bytes",
        "server_failures": "nv_inference_request_failure",
        "server_success": "nv_inference_request_success",
    }
    for key, name in fields.items():
        for n in (name, f"{name}_total"):  # untyped (Triton's) or counter
            if n in sums:
                out[key] = int(sums[n])
    if pool:
        out["pool"] = pool
    return out

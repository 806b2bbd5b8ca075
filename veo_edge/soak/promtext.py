"""What the soak reads from a server's Prometheus ``/metrics`` (the names ``veo-edge serve`` and Triton
export), parsed with ``prometheus_client``'s text parser."""

from __future__ import annotations

from typing import Any

_POOL = "veo_edge_memory_pool_"
#: counters by backend: (key in the scrape, sample name, the label beside ``backend``)
_BY_BACKEND = (
    ("faults", "veo_edge_backend_faults_total", "kind"),
    ("retries", "veo_edge_retries_total", "outcome"),
)


def scrape(text: str) -> dict[str, Any]:
    """The server's RSS, fds, fallbacks, batches, active backend, GPU memory and pool stats, and its
    faults and retries by backend (``{backend: {kind or outcome: n}}``)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    out: dict[str, Any] = {}
    pool: dict[str, float] = {}
    by_backend: dict[str, dict[str, dict[str, int]]] = {"faults": {}, "retries": {}}
    counts_faults = False  # the server exports the faults family (veo-edge serve), samples or not
    for family in text_string_to_metric_families(text):
        counts_faults = counts_faults or family.name in ("veo_edge_backend_faults", _BY_BACKEND[0][1])
        for s in family.samples:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
            if s.name == "veo_edge_active_backend" and s.value == 1:
                out["active_backend"] = s.labels.get("backend")
            if s.name.startswith(_POOL):
                pool[s.name[len(_POOL) :]] = s.value
            for key, name, label in _BY_BACKEND:
                if s.name == name:  # summed over the models a server serves
                    counts = by_backend[key].setdefault(s.labels.get("backend", "?"), {})
                    counts[s.labels.get(label, "?")] = counts.get(s.labels.get(label, "?"), 0) + int(s.value)
    fields = {
        "rss": "process_resident_memory_bytes",
        "fds": "process_open_fds",
        "fallbacks": "veo_edge_fallback_switches_total",
        "recoveries": "veo_edge_fallback_recoveries_total",
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
    if counts_faults:  # a server that counts them (veo-edge serve): none yet is zero, not unknown
        out.update(by_backend)
    return out

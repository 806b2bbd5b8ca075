"""The bodies of the protocol extensions that describe a model: metadata, Triton's model configuration
and Triton's statistics, as pure functions of the model's spec and the runtime's numbers (the service
gathers those, any transport encodes the result).
"""

from __future__ import annotations

from typing import Any

from veo_edge.serve.protocol import CONFIG_TYPES, ModelSpec

#: the protocol extensions this server implements, exactly (``GET /v2``)
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "model_repository", "statistics"]


def model_metadata(m: ModelSpec, precision: str, about: dict[str, Any] | None = None) -> dict[str, Any]:
    """KServe's model metadata; ``parameters``: the precision served and ``about`` (the active backend,
    the build's manifest sha256: what ``veo-edge healthcheck --build-dir`` compares its build with)."""
    return {
        "name": m.name,
        "versions": [m.version],
        "platform": "veo-edge",
        "inputs": [t.to_metadata() for t in m.inputs],
        "outputs": [t.to_metadata() for t in m.outputs],
        "parameters": {"precision": precision, **(about or {})},
    }


def model_config(
    m: ModelSpec,
    labels: list[str] | None,
    backend: str,
    max_queue_delay_ms: float,
    precision: str,
    batch_limit: int | None = None,
) -> dict[str, Any]:
    """Triton's model configuration, enough for tritonclient, perf_analyzer and model_analyzer;
    ``batch_limit``: the largest batch the server runs (``serve --batch-limit``; default the build's)."""

    def tensor(t):  # dims without the batch axis, as Triton writes them when max_batch_size > 0
        entry = {
            "name": t.name,
            "data_type": CONFIG_TYPES[t.datatype],
            "format": "FORMAT_NONE",
            "dims": list(t.shape[1:]),
        }
        if t in m.outputs and labels:
            entry["label_filename"] = "labels.txt"
        return entry

    return {
        "name": m.name,
        "platform": "",
        "backend": f"veo-edge-{backend}",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": m.max_batch,
        "input": [tensor(t) for t in m.inputs],
        "output": [tensor(t) for t in m.outputs],
        "dynamic_batching": {
            "preferred_batch_size": [batch_limit or m.max_batch],
            "max_queue_delay_microseconds": int(max_queue_delay_ms * 1000),
        },
        "parameters": {"precision": {"string_value": precision}},
        "instance_group": [
            {"name": m.name, "kind": "KIND_GPU" if backend == "tensorrt" else "KIND_CPU", "count": 1}
        ],
    }


def statistics(m: ModelSpec, s: dict[str, Any], r: Any) -> dict[str, Any]:
    """Triton's statistics extension (durations in ns) for model ``m`` from ``Runtime.stats()`` ``s`` and
    the server's request counts ``r`` (:class:`veo_edge.serve.metrics.RequestTimes`).

    Triton's convention: ``inference_stats`` counts requests (a request of 4 samples is one), each
    carrying the whole time of the batch it ran in, so ``compute_infer.ns / compute_infer.count`` is the
    mean batch time a request saw; ``inference_count`` counts samples, ``execution_count`` batches, and
    ``batch_stats`` has, per executed batch size, the batches' count and total compute time."""
    sizes = {int(k): int(v) for k, v in (s.get("batch_size_counts") or {}).items()}
    compute = {int(k): float(v) for k, v in (s.get("batch_compute_us") or {}).items()}

    def cn(count: int, us: float) -> dict[str, int]:
        return {"count": int(count), "ns": int(us * 1000)}

    ok, fail = r.success, r.failure
    return {
        "model_stats": [
            {
                "name": m.name,
                "version": m.version,
                "last_inference": int(s.get("last_inference_ms", 0)),
                "inference_count": sum(k * v for k, v in sizes.items()),
                "execution_count": s["batches"],
                "inference_stats": {
                    "success": cn(ok, r.request_ns / 1e3),
                    "fail": cn(fail, 0),
                    "queue": cn(ok, r.queue_ns / 1e3),
                    "compute_input": cn(ok, 0),
                    "compute_infer": cn(ok, r.compute_ns / 1e3),
                    "compute_output": cn(ok, 0),
                    "cache_hit": cn(0, 0),
                    "cache_miss": cn(0, 0),
                },
                "batch_stats": [
                    {
                        "batch_size": k,
                        "compute_input": cn(v, 0),
                        "compute_infer": cn(v, compute.get(k, 0.0)),
                        "compute_output": cn(v, 0),
                    }
                    for k, v in sorted(sizes.items())
                ],
            }
        ]
    }

"""What a deploy needs to know about a target device class and an image, read from the image's labels.

The device classes themselves (base images, CUDA architectures, GPU runtime options) are pure data in
:mod:`veo_edge.targets`; this module turns one into Docker run options, and reads what the image says
about itself (its target, port variable, cache directory) from the labels ``veo-edge build --target``
puts on it. Also the two things every orchestrator's rendering shares: the node label that places a
service on its device class (:data:`NODE_LABEL`), and ``--memory`` sizes in bytes (:func:`memory_bytes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from veo_edge.errors import UsageError

#: labels veo-edge images carry (see veo_edge/packaging); absent labels fall back to the defaults below
LABEL_TARGET = "io.veo-edge.target"
LABEL_MODEL = "io.veo-edge.model.name"
LABEL_CACHE_DIR = "io.veo-edge.cache-dir"
LABEL_PORT_ENV = "io.veo-edge.port-env"
DEFAULT_CACHE_DIR = "/cache"  # the VOLUME of veo-edge images (packaging/Dockerfile)
DEFAULT_PORT_ENV = "VEO_EDGE_PORT"
#: the gRPC port of a veo-edge image's server (its entrypoint adds a replica's slot offset)
GRPC_PORT_ENV = "VEO_EDGE_GRPC_PORT"
#: the gRPC port the image's entrypoint serves when no deploy sets it
IMAGE_GRPC_PORT = 8001
#: the separate Prometheus port the image's entrypoint serves (-1 or unset: off), shifted per slot too
METRICS_PORT_ENV = "VEO_EDGE_METRICS_PORT"
#: the node label naming a node's device class (a Swarm placement constraint, a Kubernetes nodeSelector)
NODE_LABEL = "veo.target"


def memory_bytes(text: str) -> int:
    """``512m``, ``2g``, ``1.5G``, ``1048576`` -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise UsageError(f"--memory {text!r} is not a size; e.g. 512m or 2g")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


@dataclass(frozen=True)
class GpuRun:
    """How a container gets the GPU on a device class: Jetson's ``--runtime nvidia``, x86's device
    requests (``--gpus all``), or nothing (cpu)."""

    runtime: str | None = None
    device_requests: bool = False
    #: Kubernetes: the RuntimeClass and the extended resource a GPU pod asks for
    k8s_runtime_class: str | None = None
    k8s_gpu_resource: str | None = None


def gpu_run(target: str) -> GpuRun:
    """The GPU options of device class ``target`` (:mod:`veo_edge.targets`); unknown: a usage error."""
    from veo_edge.targets import get_target

    t = get_target(target)
    return GpuRun(
        runtime=t.gpu_runtime,
        device_requests=t.gpu_device_request,
        k8s_runtime_class="nvidia" if t.has_gpu else None,
        k8s_gpu_resource="nvidia.com/gpu" if t.has_gpu else None,
    )


@dataclass(frozen=True)
class ImageFacts:
    """What an image says about itself through its labels and config."""

    ref: str
    image_id: str
    target: str
    model: str | None
    cache_dir: str
    port_env: str
    has_healthcheck: bool
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, client: Any, ref: str, target: str | None = None) -> ImageFacts:
        image = client.images.get(ref)
        config = image.attrs.get("Config") or {}
        labels = dict(config.get("Labels") or {})
        found = target or labels.get(LABEL_TARGET) or "cpu"
        gpu_run(found)  # an unknown target is a usage error here, before anything starts
        return cls(
            ref=ref,
            image_id=image.id,
            target=found,
            model=labels.get(LABEL_MODEL),
            cache_dir=labels.get(LABEL_CACHE_DIR, DEFAULT_CACHE_DIR),
            port_env=labels.get(LABEL_PORT_ENV, DEFAULT_PORT_ENV),
            has_healthcheck=bool((config.get("Healthcheck") or {}).get("Test")),
            labels=labels,
        )

"""Shipping what ``veo-edge build --target`` made: onto one device's Docker engine, a Docker Swarm, or
Kubernetes/k3s manifests. Everything here talks to engines through the Docker SDK (imported lazily)."""

from veo_edge.deploy.device import deploy_container, recover, rollback, status
from veo_edge.deploy.engines import EngineAddress, TlsFiles, local_engine
from veo_edge.deploy.k8s import Workload, write_manifests
from veo_edge.deploy.profiles import ImageFacts
from veo_edge.deploy.runopts import RunOptions
from veo_edge.deploy.swarm import ServiceOptions, deploy_service, rollback_service, service_status
from veo_edge.deploy.transfer import transfer_image

__all__ = [
    "EngineAddress",
    "ImageFacts",
    "RunOptions",
    "ServiceOptions",
    "TlsFiles",
    "Workload",
    "deploy_container",
    "deploy_service",
    "local_engine",
    "recover",
    "rollback",
    "rollback_service",
    "service_status",
    "status",
    "transfer_image",
    "write_manifests",
]

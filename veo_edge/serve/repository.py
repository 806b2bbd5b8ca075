"""Several models in one server: which build directories to serve, and one service object over them.

``veo-edge serve DIR [DIR ...]`` takes build directories, or model repositories (folders whose
subfolders are build directories, as Triton's model repository: the subfolder's name is the model's
name), or a mix. Each model gets its own runtime, batcher and readiness (its own
:class:`~veo_edge.serve.app.InferenceService`); :class:`ModelSet` dispatches every per-model call by
name (an unknown model is a 404 / NOT_FOUND) and answers the server-wide ones (ready when every model
is ready; statistics of all models; one metrics registry).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veo_edge.builddir import MANIFEST_NAME, BuildDir
from veo_edge.errors import BuildDirError, UsageError
from veo_edge.serve.protocol import ProtocolError

log = logging.getLogger("veo_edge.serve")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    build: BuildDir


def find_models(paths: Sequence[str | Path], model_name: str | None = None) -> list[ModelEntry]:
    """The models to serve from build directories and model repositories (see the module docstring)."""
    if not paths:
        raise UsageError("no build directory given; pass one or more, or a folder of them")
    entries: list[ModelEntry] = []
    for raw in paths:
        path = Path(raw)
        if (path / MANIFEST_NAME).is_file() or not path.is_dir():
            build = BuildDir.open(path)  # says what is missing
            entries.append(ModelEntry(build.model_name, build))
            continue
        subs = sorted(p for p in path.iterdir() if (p / MANIFEST_NAME).is_file())
        if not subs:
            raise BuildDirError(
                f"{path} is neither a build directory (no {MANIFEST_NAME}) nor a model repository (none of "
                "its subfolders has one); pass directories made by `veo-edge build`, or a folder of them"
            )
        entries.extend(ModelEntry(p.name, BuildDir.open(p)) for p in subs)
        others = sorted(p.name for p in path.iterdir() if p.is_dir() and p not in subs and p.name[0] != ".")
        if others:  # an interrupted copy or a misnamed build would otherwise vanish without a word
            log.warning(
                "model repository %s: not serving %s (no %s: not a veo-edge build)",
                path, ", ".join(f"{n}/" for n in others), MANIFEST_NAME,
            )  # fmt: skip
    if model_name is not None:
        if len(entries) != 1:
            raise UsageError(
                f"--model-name names one model, but {len(entries)} are served "
                f"({', '.join(e.name for e in entries)}); in a model repository the folder names the model"
            )
        entries = [ModelEntry(model_name, entries[0].build)]
    seen: dict[str, Path] = {}
    for e in entries:
        if e.name in seen:
            raise UsageError(
                f"two builds would serve as model {e.name!r}: {seen[e.name]} and {e.build.path}; serve each "
                "name once (in a model repository, rename one folder)"
            )
        seen[e.name] = e.build.path
    return entries


class ModelSet:
    """The service object over several per-model services: the same methods, dispatched by model name."""

    def __init__(self, services: dict[str, Any]) -> None:
        from veo_edge.serve.metrics import HttpCounters

        if not services:
            raise UsageError("a model set needs at least one model")
        self.services = dict(services)
        #: what the transports count (responses by route and status); each model counts its own rejections
        self.counters = HttpCounters()
        self.registry = merged_registry(
            [svc.registry for svc in self.services.values()] + [_counters_registry(self.counters)]
        )
        self._draining = False

    async def start(self) -> None:
        for svc in self.services.values():
            await svc.start()

    async def close(self) -> None:
        for svc in self.services.values():
            await svc.close()

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value
        for svc in self.services.values():
            svc.draining = value

    @property
    def infer_answered(self) -> int:
        return sum(svc.infer_answered for svc in self.services.values())

    # -- dispatch -------------------------------------------------------------------------------
    def service(self, name: str) -> Any:
        svc = self.services.get(name)
        if svc is None:
            raise ProtocolError(f"unknown model {name!r}; {self.serves()}", 404)
        return svc

    def serves(self) -> str:
        if len(self.services) == 1:
            return f"this server serves {next(iter(self.services))!r}"
        return f"this server serves: {', '.join(sorted(self.services))}"

    def model_spec(self, name: str, version: str | None = None) -> Any:
        return self.service(name).model_spec(name, version)

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        return self.service(name).model_metadata(name, version)

    def model_readiness(self, name: str, version: str | None = None) -> dict[str, Any]:
        return self.service(name).model_readiness(name, version)

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        return self.service(name).model_config(name, version)

    def expect(self, name: str) -> Any:
        svc = self.services.get(name)
        return None if svc is None else svc.expect(name)

    async def infer(
        self, name: str, version: str | None, request: Any, arrival: Any = None, protocol: str = "http"
    ) -> dict[str, Any]:
        return await self.service(name).infer(name, version, request, arrival, protocol)

    def model_labels(self, name: str) -> list[str] | None:
        return self.service(name).model_labels(name)

    def canary_body(
        self, name: str, version: str | None = None, binary: bool = False
    ) -> tuple[bytes, int | None]:
        return self.service(name).canary_body(name, version, binary)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return [e for svc in self.services.values() for e in svc.repository_index(ready_only)]

    def _repo_service(self, name: str, action: str) -> Any:
        if name not in self.services:
            raise ProtocolError(
                f"cannot {action} model {name!r}: the repository holds only {', '.join(sorted(self.services))}",
                400,
            )
        return self.services[name]

    async def load_model(self, name: str) -> None:
        await self._repo_service(name, "load").load_model(name)

    async def unload_model(self, name: str) -> None:
        await self._repo_service(name, "unload").unload_model(name)

    # -- server-wide ----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self.services)

    def server_metadata(self) -> dict[str, Any]:
        return next(iter(self.services.values())).server_metadata()

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        if name is not None:
            return self.service(name).statistics(name, version)
        return {"model_stats": [m for s in self.services.values() for m in s.statistics()["model_stats"]]}

    def readiness(self) -> dict[str, Any]:
        """Ready when every model is; one model's body as it is, several under ``models``."""
        bodies = {name: svc.readiness() for name, svc in self.services.items()}
        if len(bodies) == 1:
            return next(iter(bodies.values()))
        body: dict[str, Any] = {"ready": all(b["ready"] for b in bodies.values()), "models": bodies}
        reasons = [f"{name}: {b['reason']}" for name, b in bodies.items() if not b["ready"]]
        if reasons:
            body["reason"] = "; ".join(reasons)
        return body

    def is_ready(self) -> bool:
        return bool(self.readiness()["ready"])

    def live(self) -> dict[str, Any]:
        return {"live": True, "models": {name: svc.live() for name, svc in self.services.items()}}


#: families whose samples carry no model label and count per service: summed across the services
SUMMED_FAMILIES = frozenset({"veo_edge_http_responses"})


class MergedCollector:
    """One Prometheus collector over several registries: families of the same name are merged; a
    sample several of them report under the same labels appears once (process metrics, GPU memory),
    or, in :data:`SUMMED_FAMILIES`, once with the sum."""

    def __init__(self, registries: Sequence[Any]) -> None:
        self.registries = list(registries)

    def collect(self):
        families: dict[str, Any] = {}
        samples: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Any]] = {}
        for registry in self.registries:
            for family in registry.collect():
                families.setdefault(family.name, family)
                mine = samples.setdefault(family.name, {})
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key not in mine:
                        mine[key] = sample
                    elif family.name in SUMMED_FAMILIES:
                        mine[key] = sample._replace(value=mine[key].value + sample.value)
        for name, family in families.items():
            family.samples = list(samples[name].values())
            yield family


class _CountersCollector:
    """The transports' response counts of a model set, and its inference requests refused before a model
    was known (the per-model collectors see none of them)."""

    def __init__(self, counters: Any) -> None:
        self.counters = counters

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        http = CounterMetricFamily(
            "veo_edge_http_responses", "HTTP responses by route and status", labels=["route", "code"]
        )
        for (endpoint, code), n in sorted(self.counters.responses.items()):
            http.add_metric([endpoint, str(code)], n)
        yield http
        from veo_edge.serve.metrics import infer_requests_family

        yield infer_requests_family(self.counters)  # requests refused before a model was known


def _counters_registry(counters: Any) -> Any:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_CountersCollector(counters))
    return registry


def merged_registry(registries: Sequence[Any]) -> Any:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedCollector(registries))
    return registry

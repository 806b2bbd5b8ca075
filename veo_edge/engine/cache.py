"""The TensorRT engine cache: one serialised engine per (GPU, compute capability, TensorRT version,
plugin library, model, precision, profile), with a JSON sidecar that records the key and the engine's
checksum. A cached engine is used only when its sidecar matches the wanted key and its bytes match the
recorded checksum; anything else is a reason to rebuild, never an engine to trust.

The cache lives in ``$VEO_EDGE_ENGINE_CACHE`` when set, else in ``<build dir>/engines``. Next to the
engines, a :class:`ChoiceRecord` keeps which of a build's two engines (with veo-edge's plugins, or
TensorRT's own) was chosen and why, with both timings (see :mod:`veo_edge.engine.selection`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veo_edge.builddir import sha256_file

if TYPE_CHECKING:
    from veo_edge.engine.selection import Decision

ENV_VAR = "VEO_EDGE_ENGINE_CACHE"
FORMAT = 1


@dataclass(frozen=True)
class EngineKey:
    gpu_name: str
    compute_capability: str  # "8.7"
    trt_version: str
    plugin_sha256: str | None  # None: the plain ONNX, no plugin library
    model_sha256: str  # of the ONNX the engine is built from
    precision: str
    max_batch: int
    opt_batch: int

    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def filename(self, model: str) -> str:
        safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model)
        sm = self.compute_capability.replace(".", "")
        return f"{safe}-{self.precision}-sm{sm}-trt{self.trt_version}-{self.digest()[:16]}.engine"


@dataclass(frozen=True)
class CacheEntry:
    engine: Path
    sidecar: Path

    @classmethod
    def for_key(cls, cache_dir: Path, model: str, key: EngineKey) -> CacheEntry:
        engine = Path(cache_dir) / key.filename(model)
        return cls(engine, engine.with_suffix(".json"))

    def check(self, key: EngineKey) -> str | None:
        """``None`` when the entry can be deserialised for ``key``, else why it must be rebuilt."""
        if not self.engine.is_file():
            return f"no cached engine at {self.engine}"
        try:
            meta = json.loads(self.sidecar.read_text())
        except (OSError, ValueError) as e:
            return f"cache sidecar {self.sidecar} is missing or unreadable ({e})"
        if meta.get("format") != FORMAT:
            return f"cache sidecar {self.sidecar} has format {meta.get('format')!r}, expected {FORMAT}"
        if meta.get("key") != asdict(key):
            got = meta.get("key") or {}
            diff = sorted(k for k in asdict(key) if got.get(k) != asdict(key)[k])
            return f"cached engine was built for another {', '.join(diff) or 'key'}"
        if self.engine.stat().st_size != meta.get("bytes") or sha256_file(self.engine) != meta.get("sha256"):
            return f"cached engine {self.engine} does not match its recorded checksum (truncated or modified)"
        return None

    def read_meta(self) -> dict[str, Any]:
        return json.loads(self.sidecar.read_text())

    def write(self, key: EngineKey, engine: bytes, **extra: Any) -> None:
        """Write engine then sidecar, each atomically, so a crash never leaves a matching half entry."""
        self.engine.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.engine, engine)
        meta = {
            "format": FORMAT,
            "key": asdict(key),
            "bytes": len(engine),
            "sha256": hashlib.sha256(engine).hexdigest(),
            **extra,
        }
        atomic_write(self.sidecar, (json.dumps(meta, indent=2) + "\n").encode())


@dataclass(frozen=True)
class ChoiceRecord:
    """Which engine of a build serves on this GPU and TensorRT, for one precision and profile: the
    decision of :func:`veo_edge.engine.selection.decide`, keyed by both engines' cache keys."""

    path: Path

    @classmethod
    def for_keys(
        cls, cache_dir: Path, model: str, plain: EngineKey, plugins: EngineKey | None
    ) -> ChoiceRecord:
        both = json.dumps({"plain": asdict(plain), "plugins": plugins and asdict(plugins)}, sort_keys=True)
        digest = hashlib.sha256(both.encode()).hexdigest()[:16]
        safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model)
        sm = plain.compute_capability.replace(".", "")
        name = f"{safe}-{plain.precision}-sm{sm}-trt{plain.trt_version}-{digest}.choice.json"
        return cls(Path(cache_dir) / name)

    def write(self, plain: EngineKey, plugins: EngineKey | None, decision: Decision, **extra: Any) -> None:
        meta = {
            "format": FORMAT,
            "model_keys": {"plain": asdict(plain), "plugins": plugins and asdict(plugins)},
            "decision": decision.to_dict(),
            **extra,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, (json.dumps(meta, indent=2) + "\n").encode())

    def read(self, plain: EngineKey, plugins: EngineKey | None) -> Decision | None:
        """The recorded decision for exactly these keys, or ``None`` (absent, unreadable, other keys)."""
        from veo_edge.engine.selection import Decision

        try:
            meta = json.loads(self.path.read_text())
            keys = meta["model_keys"]
            if meta.get("format") != FORMAT or keys != {
                "plain": asdict(plain),
                "plugins": plugins and asdict(plugins),
            }:
                return None
            return Decision.from_dict(meta["decision"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


def read_choices(cache_dir: Path, model: str) -> list[dict[str, Any]]:
    """Every readable choice record of ``model`` in ``cache_dir`` (for ``veo-edge inspect``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model)
    out = []
    for path in sorted(Path(cache_dir).glob(f"{safe}-*.choice.json")):
        try:
            out.append({"path": str(path), **json.loads(path.read_text())})
        except (OSError, ValueError):
            continue
    return out


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed into place: readers see the old file
    or the new one, never a torn one (two writers: the last rename wins, each file whole)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def cache_dir(build_path: Path) -> Path:
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else Path(build_path) / "engines"


def timing_cache_path(cache: Path, key: EngineKey) -> Path:
    """The timing cache is shared by every engine of the same GPU and TensorRT version."""
    sm = key.compute_capability.replace(".", "")
    return Path(cache) / f"timing-sm{sm}-trt{key.trt_version}.cache"

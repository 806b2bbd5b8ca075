"""The plugin op specs (``plugins/<op>/spec.json``) as typed Python objects.

The JSON files are the single source of truth for both ops: the C++ plugin library generates a header
from them, and the surgery builds its nodes through :meth:`PluginSpec.make_node`, which resolves defaults,
validates every attribute against the spec and stamps the node with the domain, ``plugin_version`` and
``plugin_namespace`` that TensorRT's ONNX parser uses to find the plugin creator.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veo_edge.errors import VeoEdgeError

#: ``plugins/`` beside the package (the repository root of a source checkout or an editable install)
SOURCE_PLUGINS_DIR = Path(__file__).resolve().parents[2] / "plugins"
#: the copy a wheel ships (see setup.py), for installs without the source tree
PACKAGED_PLUGINS_DIR = Path(__file__).resolve().parents[1] / "_plugin_specs"
PLUGINS_DIR = SOURCE_PLUGINS_DIR if SOURCE_PLUGINS_DIR.is_dir() else PACKAGED_PLUGINS_DIR
#: spec file folder per op name
SPEC_DIRS = {"VeoAttention": "veoAttention", "VeoPatchEmbedLayerNorm": "veoPatchEmbedLayerNorm"}
_ATTR_TYPES = ("int", "ints", "float", "floats", "string")


class SpecError(VeoEdgeError):
    """A plugin spec file is missing or malformed, or a node does not fit its spec."""

    exit_code = 2


@dataclass(frozen=True)
class AttrSpec:
    name: str
    type: str  # one of _ATTR_TYPES
    required: bool
    default: Any = None
    min: float | None = None
    max: float | None = None
    doc: str = ""

    def coerce(self, op: str, value: Any) -> Any:
        """``value`` in the attribute's Python type, checked against the spec's bounds."""
        try:
            if self.type == "int":
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError(value)
                out: Any = int(value)
                items = [out]
            elif self.type == "float":
                out = float(value)
                if not math.isfinite(out):
                    raise ValueError(value)
                items = [out]
            elif self.type == "ints":
                out = [int(v) for v in value]
                items = out
            elif self.type == "floats":
                out = [float(v) for v in value]
                items = out
            else:
                out = str(value)
                items = []
        except (TypeError, ValueError):
            raise SpecError(
                f"{op} attribute {self.name!r} must be of type {self.type}, got {value!r}"
            ) from None
        for v in items:
            if (self.min is not None and v < self.min) or (self.max is not None and v > self.max):
                raise SpecError(
                    f"{op} attribute {self.name}={value!r} is out of range; the spec allows "
                    f"{self.min if self.min is not None else '-inf'}..{self.max if self.max is not None else 'inf'}"
                )
        return out


@dataclass(frozen=True)
class TensorSpec:
    name: str
    type: str
    shape: tuple[str, ...]
    optional: bool = False
    doc: str = ""
    since_version: str = "1"  # the first version of the op that has this input


@dataclass(frozen=True)
class PluginSpec:
    name: str
    version: str
    namespace: str
    domain: str
    min_sm: int
    description: str
    attributes: tuple[AttrSpec, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    path: Path
    #: every version the plugin library registers a creator for (TensorRT keys creators by name and
    #: version); an older version is the newest one without the inputs added since
    versions: tuple[str, ...] = ()

    def inputs_of(self, version: str) -> tuple[TensorSpec, ...]:
        """The inputs a node of ``version`` takes."""
        if version not in self.versions:
            raise SpecError(
                f"{self.name} has no version {version!r}; the spec ({self.path}) lists: {', '.join(self.versions)}"
            )
        return tuple(t for t in self.inputs if int(t.since_version) <= int(version))

    def attr(self, name: str) -> AttrSpec:
        for a in self.attributes:
            if a.name == name:
                return a
        raise SpecError(
            f"{self.name} has no attribute {name!r}; the spec ({self.path}) lists: "
            + ", ".join(a.name for a in self.attributes)
        )

    def resolve_attrs(self, **given: Any) -> dict[str, Any]:
        """Every attribute of the spec, from ``given`` or its default, type-checked and bounded."""
        unknown = sorted(set(given) - {a.name for a in self.attributes})
        if unknown:
            raise SpecError(
                f"{self.name} has no attribute(s) {', '.join(unknown)}; the spec lists: "
                + ", ".join(a.name for a in self.attributes)
            )
        out: dict[str, Any] = {}
        for a in self.attributes:
            if a.name in given:
                out[a.name] = a.coerce(self.name, given[a.name])
            elif a.required:
                raise SpecError(f"{self.name} needs attribute {a.name!r} ({a.doc}); none was given")
            else:
                out[a.name] = a.coerce(self.name, a.default)
        return out

    def node_attrs(self, *, version: str | None = None, **given: Any) -> dict[str, Any]:
        """The attributes a node of this op carries: all spec attributes (defaults written out), plus the
        ``plugin_version`` (``version``, default the newest) and ``plugin_namespace`` strings of
        TensorRT's plugin importer."""
        version = self.version if version is None else str(version)
        self.inputs_of(version)  # a known version
        return {
            **self.resolve_attrs(**given),
            "plugin_version": version,
            "plugin_namespace": self.namespace,
        }

    def _check_inputs(self, n: int, version: str | None) -> None:
        allowed = self.inputs_of(self.version if version is None else str(version))
        least = sum(not t.optional for t in allowed)
        if not least <= n <= len(allowed):
            raise SpecError(
                f"{self.name} version {version or self.version} takes {least}..{len(allowed)} inputs "
                f"({', '.join(t.name for t in allowed)}), got {n}"
            )

    def make_node(
        self,
        inputs: list,
        outputs: list,
        name: str | None = None,
        *,
        version: str | None = None,
        **attrs: Any,
    ):
        """An onnx-graphsurgeon node of this op (inputs/outputs are ``gs.Tensor`` objects)."""
        import onnx_graphsurgeon as gs

        self._check_inputs(len(inputs), version)
        return gs.Node(
            op=self.name,
            name=name,
            domain=self.domain,
            attrs=self.node_attrs(version=version, **attrs),
            inputs=inputs,
            outputs=outputs,
        )

    def make_onnx_node(
        self,
        inputs: list[str],
        outputs: list[str],
        name: str | None = None,
        *,
        version: str | None = None,
        **attrs: Any,
    ):
        """The same as an ``onnx.NodeProto`` (tensor names)."""
        import onnx

        self._check_inputs(len(inputs), version)
        return onnx.helper.make_node(
            self.name,
            inputs,
            outputs,
            name=name,
            domain=self.domain,
            **self.node_attrs(version=version, **attrs),
        )


def _parse(data: dict[str, Any], path: Path) -> PluginSpec:
    for key in ("name", "version", "namespace", "domain", "attributes", "inputs", "outputs"):
        if key not in data:
            raise SpecError(f"plugin spec {path} lacks the {key!r} field; every plugin spec needs it")
    attrs = []
    for a in data["attributes"]:
        if a.get("type") not in _ATTR_TYPES:
            raise SpecError(
                f"plugin spec {path}: attribute {a.get('name')!r} has type {a.get('type')!r}; "
                f"expected one of {', '.join(_ATTR_TYPES)}"
            )
        required = bool(a.get("required", "default" not in a))
        if not required and "default" not in a:
            raise SpecError(f"plugin spec {path}: optional attribute {a['name']!r} needs a default")
        attrs.append(
            AttrSpec(
                a["name"], a["type"], required, a.get("default"), a.get("min"), a.get("max"), a.get("doc", "")
            )
        )

    def tensors(items: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
        return tuple(
            TensorSpec(
                t["name"],
                t["type"],
                tuple(t.get("shape", ())),
                bool(t.get("optional")),
                t.get("doc", ""),
                str(t.get("since_version", "1")),
            )
            for t in items
        )

    spec = PluginSpec(
        name=data["name"],
        version=str(data["version"]),
        namespace=data["namespace"],
        domain=data["domain"],
        min_sm=int(data.get("min_sm", 0)),
        description=data.get("description", ""),
        attributes=tuple(attrs),
        inputs=tensors(data["inputs"]),
        outputs=tensors(data["outputs"]),
        path=path,
        versions=tuple(str(v) for v in data.get("versions", [data["version"]])),
    )
    if spec.version not in spec.versions or any(t.since_version not in spec.versions for t in spec.inputs):
        raise SpecError(
            f"plugin spec {path}: version {spec.version!r} and every input's since_version must be among "
            f"its versions {list(spec.versions)}"
        )
    for a in spec.attributes:  # defaults must themselves satisfy the spec
        if not a.required:
            a.coerce(spec.name, a.default)
    return spec


@functools.cache
def load_spec(op: str, plugins_dir: Path | None = None) -> PluginSpec:
    """The spec of ``op`` (``VeoAttention`` or ``VeoPatchEmbedLayerNorm``) from ``plugins/<op>/spec.json``."""
    if op not in SPEC_DIRS:
        raise SpecError(f"unknown plugin op {op!r}; choose one of: {', '.join(SPEC_DIRS)}")
    path = (plugins_dir or PLUGINS_DIR) / SPEC_DIRS[op] / "spec.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(
            f"plugin spec {path} does not exist; veo-edge needs its plugins/ folder (run from a source checkout "
            "or an install that ships plugins/)"
        ) from None
    except ValueError as e:
        raise SpecError(f"plugin spec {path} is not valid JSON: {e}") from e
    spec = _parse(data, path)
    if spec.name != op:
        raise SpecError(f"plugin spec {path} names op {spec.name!r}, expected {op!r}")
    return spec


def attention_spec() -> PluginSpec:
    return load_spec("VeoAttention")


def patch_embed_spec() -> PluginSpec:
    return load_spec("VeoPatchEmbedLayerNorm")

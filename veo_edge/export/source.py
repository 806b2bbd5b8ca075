"""Where a build's model comes from: a built-in variant, a user factory (``pkg.mod:factory``), or an
existing ONNX file. Each source is cheap to construct and loads on :meth:`load`. Checkpoints load
through :mod:`veo_edge.models.checkpoint` (its names are re-exported here)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veo_edge.errors import ModelLoadError, UsageError
from veo_edge.models.checkpoint import CHECKPOINT_NAMES, check_input_file, load_checkpoint
from veo_edge.models.checkpoint import checkpoint_mismatches as checkpoint_mismatches  # re-exported

if TYPE_CHECKING:
    from torch import nn


@dataclass
class LoadedModel:
    """A model ready for export: a torch module (or an ONNX file), its sample shape and description."""

    name: str
    input_shape: tuple[int, ...]  # one sample, without the batch axis
    module: nn.Module | None = None
    onnx_path: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    #: external data files the ONNX file's tensors live in (torch's dynamo exporter writes model.onnx.data)
    onnx_external_data: tuple[Path, ...] = ()
    #: class names by index (the manifest's ``labels``), when the checkpoint has them
    labels: list[str] | None = None
    #: how a picture becomes an input (the manifest's ``preprocess``: ``Preprocess.to_manifest()``)
    preprocess: dict[str, Any] | None = None
    #: what the load noticed, shown after the build (e.g. which output a bare backbone serves)
    notes: list[str] = field(default_factory=list)


def parse_input_shape(text: str | None) -> tuple[int, ...] | None:
    """``"3,224,224"`` or ``"3x224x224"`` -> (3, 224, 224), without the batch axis."""
    if text is None:
        return None
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(
            f"--input-shape {text!r} is not a list of positive integers; expected one sample without "
            "the batch axis, e.g. 3,224,224 (image) or 3,8,224,224 (video)"
        )
    return dims


@dataclass(frozen=True)
class BuiltinSource:
    """A built-in architecture: its shipped weights or seeded ones, or the user's ``checkpoint``."""

    name: str
    seed: int = 0
    checkpoint: Path | None = None

    def __post_init__(self) -> None:
        from veo_edge.models.registry import get_config

        get_config(self.name)  # an unknown name fails here, before any slow work

    def load(self) -> LoadedModel:
        from veo_edge.models import create_model
        from veo_edge.models.registry import builtin_data, pretrained_weights

        built = create_model(self.name, seed=self.seed, pretrained=self.checkpoint is None)
        if self.checkpoint is not None:
            load_checkpoint(built.module, self.checkpoint)
            weights = f"checkpoint:{Path(self.checkpoint).name}"
        elif pretrained_weights(self.name) is not None:
            weights = "shipped"
        else:
            weights = f"seed:{self.seed}"
        data = builtin_data(self.name)
        return LoadedModel(
            name=self.name,
            input_shape=built.config.input_shape,
            module=built.module.eval(),
            config={"family": "vit", "weights": weights, **built.config.to_dict()},
            source=f"builtin:{self.name}",
            labels=getattr(data, "LABELS", None),
            preprocess=data.picture_preprocess() if hasattr(data, "picture_preprocess") else None,
        )


@dataclass(frozen=True)
class ModuleSource:
    """A user callable ``pkg.mod:factory`` returning an ``nn.Module``, with an optional checkpoint."""

    spec: str
    input_shape: tuple[int, ...] | None = None
    checkpoint: Path | None = None

    def load(self) -> LoadedModel:
        mod_name, sep, attr = self.spec.partition(":")
        if not sep or not mod_name or not attr:
            raise UsageError(f"--module {self.spec!r} is not of the form pkg.mod:factory")
        if self.checkpoint is not None:  # a wrong path fails before the model is made
            check_input_file(Path(self.checkpoint), "--checkpoint", "checkpoint", CHECKPOINT_NAMES)
        try:
            module = importlib.import_module(mod_name)
        except ImportError as e:
            raise ModelLoadError(f"cannot import {mod_name!r} for --module {self.spec!r}: {e}") from e
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise ModelLoadError(f"{mod_name!r} has no callable {attr!r} (from --module {self.spec!r})")
        import torch

        net = factory()
        if not isinstance(net, torch.nn.Module):
            raise ModelLoadError(f"{self.spec} returned a {type(net).__name__}, expected a torch.nn.Module")
        if self.checkpoint is not None:
            load_checkpoint(net, self.checkpoint)
        shape = self.input_shape or _shape_from_module(net)
        if shape is None:
            raise UsageError(
                f"cannot tell the input shape of {self.spec}; pass --input-shape, e.g. 3,224,224 "
                "(or give the module an `input_shape` attribute)"
            )
        name = getattr(net, "name", None) or attr.replace("_", "-")
        return LoadedModel(
            name=name,
            input_shape=shape,
            module=net.eval(),
            source=f"module:{self.spec}",
            config={"family": "user", "factory": self.spec},
        )


def _shape_from_module(net: nn.Module) -> tuple[int, ...] | None:
    shape = getattr(net, "input_shape", None)
    cfg = getattr(net, "cfg", None)
    if shape is None and cfg is not None:
        shape = getattr(cfg, "input_shape", None)
    return tuple(int(d) for d in shape) if shape else None


@dataclass(frozen=True)
class OnnxSource:
    """An ONNX ViT made elsewhere."""

    path: Path

    def load(self) -> LoadedModel:
        path = Path(self.path)
        check_input_file(path, "--onnx", "ONNX file", ("model.onnx",))
        import onnx

        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as e:
            raise ModelLoadError(f"ONNX file {path} is unreadable or corrupt: {type(e).__name__}: {e}") from e
        if len(model.graph.input) == 0:
            raise ModelLoadError(f"ONNX file {path} has no graph inputs; is it a model?")
        dims = model.graph.input[0].type.tensor_type.shape.dim
        shape = tuple(d.dim_value for d in dims[1:])
        if not shape or any(d <= 0 for d in shape):
            raise ModelLoadError(
                f"ONNX file {path}: input {model.graph.input[0].name!r} needs static non-batch dims, "
                f"got {[d.dim_param or d.dim_value for d in dims]}"
            )
        external = _external_data_files(model, path)
        total = path.stat().st_size + sum(f.stat().st_size for f in external)
        if total >= PROTOBUF_LIMIT:
            raise ModelLoadError(
                f"ONNX file {path} and its external data hold {total / 1e9:.2f} GB, over protobuf's 2 GiB "
                "limit for one ONNX file; a build keeps model.onnx in one file, so models this large are not "
                "supported yet (quantise or split the model)"
            )
        return LoadedModel(
            name=path.stem,
            input_shape=shape,
            onnx_path=path,
            source=f"onnx:{path}",
            config={"family": "onnx", "file": path.name},
            onnx_external_data=external,
        )


#: protobuf's limit on one serialised message: an ONNX file with its weights inside must stay below it
PROTOBUF_LIMIT = 2**31


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every TensorProto of ``graph``: initializers and attribute tensors, in subgraphs too."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for g in attr.graphs:
                yield from _graph_tensors(g)


def _external_data_files(model: Any, path: Path) -> tuple[Path, ...]:
    """The external data files ``model`` (loaded from ``path`` without them) names, each checked to exist
    beside it; :class:`ModelLoadError` naming the first that does not."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    base = path.parent.resolve()
    files: list[Path] = []
    for tensor in _graph_tensors(model.graph):
        if not uses_external_data(tensor):
            continue
        location = ExternalDataInfo(tensor).location
        target = (base / location).resolve()
        if not target.is_relative_to(base):
            raise ModelLoadError(
                f"ONNX file {path}: tensor {tensor.name!r} keeps its data in {location!r}, outside the "
                f"file's directory {base}; external data must lie beside the .onnx"
            )
        if not target.is_file():
            raise ModelLoadError(
                f"ONNX file {path} keeps tensor {tensor.name!r} in the external data file {location!r}, which "
                f"is missing ({target} does not exist); copy it beside {path.name} under that name"
            )
        if target not in files:
            files.append(target)
    return tuple(files)


def inline_external_data(src: Path, dst: Path) -> None:
    """Write ``src`` with its external data (files beside it) read in, as one ONNX file ``dst``."""
    import onnx

    try:
        model = onnx.load(str(src), load_external_data=True)
    except Exception as e:  # a truncated or mismatched .data file: onnx raises several kinds
        raise ModelLoadError(
            f"cannot read the external data of ONNX file {src}: {type(e).__name__}: {e}; is the .data file "
            "the one exported with it?"
        ) from e
    onnx.save_model(model, str(dst))

"""Where a build's model comes from: a built-in variant, a user factory (``pkg.mod:factory``), or an
existing ONNX file. Each source is cheap to construct and loads on :meth:`load`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veo_edge.errors import ModelLoadError, UsageError

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
    name: str
    seed: int = 0

    def __post_init__(self) -> None:
        from veo_edge.models.registry import get_config

        get_config(self.name)  # an unknown name fails here, before any slow work

    def load(self) -> LoadedModel:
        from veo_edge.models import create_model

        built = create_model(self.name, seed=self.seed)
        return LoadedModel(
            name=self.name,
            input_shape=built.config.input_shape,
            module=built.module,
            config={"family": "vit", **built.config.to_dict()},
            source=f"builtin:{self.name}",
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


#: the usual checkpoint names inside a model directory (suggested when --checkpoint names the directory)
CHECKPOINT_NAMES = ("model.safetensors", "pytorch_model.bin", "model.pt", "model.pth")


def check_input_file(path: Path, flag: str, what: str, usual_names: tuple[str, ...] = ()) -> None:
    """:class:`ModelLoadError` unless ``path`` is a file: one line for a missing path and for a directory
    (naming the usual file inside it, when there is one)."""
    if path.is_dir():
        inside = next((path / n for n in usual_names if (path / n).is_file()), None)
        hint = f"; did you mean {flag} {inside}?" if inside else f"; pass the {what} inside it"
        article = "an" if what[0] in "aeiouAEIO" else "a"
        raise ModelLoadError(f"{flag} {path} is a directory, expected {article} {what}{hint}")
    if not path.is_file():
        raise ModelLoadError(f"{what} {path} does not exist")


def load_checkpoint(net: nn.Module, path: Path) -> None:
    """Load a state dict safely (``weights_only=True``; safetensors too); strict key matching."""
    import torch

    path = Path(path)
    check_input_file(path, "--checkpoint", "checkpoint", CHECKPOINT_NAMES)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ModelLoadError(
            f"checkpoint {path} is unreadable or corrupt ({type(e).__name__}: {str(e).splitlines()[0]}); "
            "expected a state_dict saved with torch.save or a .safetensors file"
        ) from e
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    if not isinstance(state, dict):
        raise ModelLoadError(f"checkpoint {path} holds a {type(state).__name__}, expected a state_dict")
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ModelLoadError(f"checkpoint {path} does not fit the model: {str(e).splitlines()[0]} ...") from e


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
        return LoadedModel(
            name=path.stem,
            input_shape=shape,
            onnx_path=path,
            source=f"onnx:{path}",
            config={"family": "onnx", "file": path.name},
        )

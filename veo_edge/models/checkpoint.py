"""Loading a checkpoint into a torch module, safely and with errors that name what does not fit: a
state_dict saved with ``torch.save`` (read with ``weights_only=True``) or a ``.safetensors`` file, matched
key for key and shape for shape. The registry loads the shipped weights through it and the export's model
sources a user's ``--checkpoint``; :func:`check_input_file` also checks their other input files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from veo_edge.errors import ModelLoadError

if TYPE_CHECKING:
    from torch import nn


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
    problems = checkpoint_mismatches(net, state)
    if problems:
        raise ModelLoadError(f"checkpoint {path} does not fit the model: {'; '.join(problems)}")
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ModelLoadError(f"checkpoint {path} does not fit the model: {str(e).splitlines()[0]} ...") from e


def checkpoint_mismatches(net: nn.Module, state: dict[str, Any], show: int = 5) -> list[str]:
    """Missing keys, unexpected keys and shape mismatches between ``state`` and ``net``, by name."""
    want = net.state_dict()

    def names(keys: list[str]) -> str:
        more = f" and {len(keys) - show} more" if len(keys) > show else ""
        return ", ".join(keys[:show]) + more

    missing = [k for k in want if k not in state]
    unexpected = [k for k in state if k not in want]
    shapes = [
        f"{k} is {list(getattr(state[k], 'shape', []))} in the checkpoint, {list(want[k].shape)} in the model"
        for k in want
        if k in state and tuple(getattr(state[k], "shape", ())) != tuple(want[k].shape)
    ]
    out = []
    if missing:
        out.append(f"{len(missing)} missing key(s): {names(missing)}")
    if unexpected:
        out.append(f"{len(unexpected)} unexpected key(s): {names(unexpected)}")
    if shapes:
        out.append(f"{len(shapes)} shape mismatch(es): {names(shapes)}")
    return out

"""torch -> ONNX with a dynamic batch axis, checked with ``onnx.checker`` (full check)."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from veo_edge.errors import ModelLoadError, UsageError

if TYPE_CHECKING:
    from torch import nn

Exporter = Literal["torchscript", "dynamo"]
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
MIN_OPSET = 17


@dataclass(frozen=True)
class OnnxExport:
    """Export ``module`` for sample shape ``input_shape`` with batch 1..max_batch to ``path``."""

    opset: int = 17
    exporter: Exporter = "torchscript"
    max_batch: int = 8

    def __post_init__(self) -> None:
        if self.opset < MIN_OPSET:
            raise UsageError(f"opset {self.opset} is too old; veo-edge exports opset {MIN_OPSET} or newer")
        if self.exporter not in ("torchscript", "dynamo"):
            raise UsageError(f"unknown exporter {self.exporter!r}; choose torchscript or dynamo")

    def __call__(
        self, module: nn.Module, input_shape: tuple[int, ...], path: Path, output_name: str = OUTPUT_NAME
    ) -> Path:
        """``output_name``: what the served output is called (a Hugging Face backbone's ``pooler_output``,
        CLIP's ``image_embeds``); clients see it in the model's metadata."""
        import torch

        sample = torch.zeros(2, *input_shape)  # batch 2: a batch of 1 can get specialised away
        kwargs: dict = {
            "input_names": [INPUT_NAME],
            "output_names": [output_name],
            "opset_version": self.opset,
        }
        if self.exporter == "dynamo":
            batch = torch.export.Dim("batch", min=1, max=max(self.max_batch, 2))
            kwargs.update(
                dynamo=True, dynamic_shapes={_first_arg(module): {0: batch}}, optimize=True, verbose=False
            )
        else:
            kwargs.update(dynamo=False, dynamic_axes={INPUT_NAME: {0: "batch"}, output_name: {0: "batch"}})
        with warnings.catch_warnings(), torch.no_grad(), _quiet_exporter():
            warnings.simplefilter("ignore")
            try:
                torch.onnx.export(module.eval(), (sample,), str(path), **kwargs)
            except Exception as e:
                raise ModelLoadError(
                    f"torch.onnx.export ({self.exporter}, opset {self.opset}) failed: "
                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                ) from e
        check_onnx(path)
        return path


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Keep the exporter's own chatter off the user's terminal: torch's dynamo exporter prints progress on
    stdout whatever ``verbose`` says (that would break ``--json``) and logs warnings such as "torchvision is
    not installed" through handlers of its own. Errors still raise."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


def _first_arg(module: nn.Module) -> str:
    import inspect

    params = [p for p in inspect.signature(module.forward).parameters.values() if p.name != "self"]
    return params[0].name if params else "x"


def check_onnx(path: Path) -> None:
    """``onnx.checker`` with the full check (shape inference included)."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:
        raise ModelLoadError(f"ONNX model {path} failed onnx.checker: {str(e).strip()[:500]}") from e

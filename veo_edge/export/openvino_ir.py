"""The CPU artifact: an OpenVINO IR (FP32, or with FP16-compressed weights) made from the plain ONNX."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veo_edge.errors import ModelLoadError


@dataclass(frozen=True)
class OpenVinoConvert:
    fp16: bool = False

    def __call__(self, onnx_path: Path, xml_path: Path) -> tuple[Path, Path]:
        import openvino as ov

        try:
            model = ov.convert_model(str(onnx_path))
        except Exception as e:
            raise ModelLoadError(f"OpenVINO could not convert {onnx_path}: {e}") from e
        _keep_onnx_names(model, onnx_path)
        ov.save_model(model, str(xml_path), compress_to_fp16=self.fp16)
        return xml_path, xml_path.with_suffix(".bin")


def _keep_onnx_names(model: Any, onnx_path: Path) -> None:
    """Give the IR's inputs and outputs the ONNX model's names and no others.

    When the converter removes a no-op op next to an input or an output, the port takes that op's tensor
    name too: CLIP's vision tower casts its pixels to its own dtype (f32 to f32), so the IR's input was
    named both ``input`` and ``/model/vision_model/embeddings/Cast_output_0``, and the runtime, which reads
    one name per port, asked clients for the second. A port keeps only the name the ONNX model gives it."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    names = {v.name for v in graph.input} | {v.name for v in graph.output}
    for port in [*model.inputs, *model.outputs]:
        mine = port.get_names() & names
        if len(mine) == 1 and port.get_names() != mine:
            port.get_tensor().set_names(mine)

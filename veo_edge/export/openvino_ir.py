"""The CPU artifact: an OpenVINO IR (FP32, or with FP16-compressed weights) made from the plain ONNX."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
        ov.save_model(model, str(xml_path), compress_to_fp16=self.fp16)
        return xml_path, xml_path.with_suffix(".bin")

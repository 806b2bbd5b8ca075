"""INT8 OpenVINO IR by NNCF post-training quantization of the FP32 IR, on a calibration set."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from veo_edge.errors import ModelLoadError, UsageError


@dataclass(frozen=True)
class Int8Quantize:
    """``nncf.quantize`` with the transformer model type (keeps softmax/LayerNorm-sensitive ops in float)."""

    calibration: np.ndarray  # (N, *input_shape) float32
    quiet: bool = False  # NNCF's own progress bars and log: to stderr, or nowhere when quiet

    def __call__(self, fp32_xml: Path, int8_xml: Path) -> tuple[Path, Path]:
        try:
            import nncf
        except ImportError as e:
            raise UsageError(f"--cpu-precision int8 needs NNCF ({e}); pip install nncf") from e
        import openvino as ov

        model = ov.Core().read_model(str(fp32_xml))
        name = model.inputs[0].get_any_name()
        samples = [{name: self.calibration[i : i + 1]} for i in range(len(self.calibration))]
        nncf.set_log_level(logging.ERROR if self.quiet else logging.WARNING)
        sink = open(os.devnull, "w") if self.quiet else contextlib.nullcontext(sys.stderr)  # noqa: SIM115
        try:
            # NNCF draws its progress with rich on stdout: keep stdout for veo-edge's own (--json) output
            with sink as out, contextlib.redirect_stdout(out):
                quantized = nncf.quantize(
                    model,
                    nncf.Dataset(samples),
                    model_type=nncf.ModelType.TRANSFORMER,
                    subset_size=len(samples),
                )
        except Exception as e:  # NNCF raises many kinds; say which stage failed and why
            raise ModelLoadError(f"NNCF could not quantize {fp32_xml}: {type(e).__name__}: {e}") from e
        ov.save_model(quantized, str(int8_xml), compress_to_fp16=False)
        return int8_xml, int8_xml.with_suffix(".bin")

"""INT8 OpenVINO IR by NNCF post-training quantization of the FP32 IR, on a calibration set.

The weights are quantized into 7 bits of the int8 range (NNCF's overflow fix on every layer, not only
the first). CPUs without VNNI (AVX2, AVX-512 without VNNI) multiply u8 activations by s8 weights into
int16 pairs that saturate when the weights use the full range, so the same IR computes differently on
them than on a VNNI CPU, and the build host's accuracy guard would not hold on a device of the other
kind. Measured on vit-digits (540 labelled test samples) on an AVX2-only AMD EPYC: 97.78 % top-1 with
the full range (f32: 98.15 %, a 0.37-point drop over the 0.2 guard), 98.15 % with 7 bits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.errors import ModelLoadError, UsageError

#: the int8 weights' range with NNCF's overflow fix: 255 x 64 x 2 = 32,640 fits the int16 pair sums
#: of CPUs without VNNI (the full range, 255 x 127 x 2, does not)
WEIGHT_RANGE = (-64, 64)
#: what the manifest records of the quantization (``cpu_precision.quantization``)
SETTINGS = {
    "tool": "nncf",
    "model_type": "transformer",
    "overflow_fix": "enable",
    "weight_range": list(WEIGHT_RANGE),
}


def import_nncf() -> Any:
    """``nncf``, imported without its side effect on the process: NNCF's logger module calls
    ``logging.setLoggerClass(NNCFLogger)`` at import, which would make every logger created afterwards
    (any library's, in a server that built in-process) an NNCFLogger. The class in force before is put
    back."""
    before = logging.getLoggerClass()
    try:
        import nncf
        import nncf.quantization.advanced_parameters  # what Int8Quantize uses: loaded under the guard too
    except ImportError as e:
        raise UsageError(f"--cpu-precision int8 needs NNCF ({e}); pip install nncf") from e
    finally:
        logging.setLoggerClass(before)
    return nncf


@dataclass(frozen=True)
class Int8Quantize:
    """``nncf.quantize`` with the transformer model type (keeps softmax/LayerNorm-sensitive ops in float)
    and the overflow fix on every layer (weights within ``WEIGHT_RANGE``: see the module doc)."""

    calibration: np.ndarray  # (N, *input_shape) float32
    quiet: bool = False  # NNCF's own progress bars and log: to stderr, or nowhere when quiet

    def __call__(self, fp32_xml: Path, int8_xml: Path) -> tuple[Path, Path]:
        nncf = import_nncf()
        import openvino as ov
        from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

        model = ov.Core().read_model(str(fp32_xml))
        name = model.inputs[0].get_any_name()
        samples = [{name: self.calibration[i : i + 1]} for i in range(len(self.calibration))]
        # NNCF's logger only, and for this call only: nncf.set_log_level also sets the level of every
        # handler its logger holds, which under a host that shares handlers (pytest's capture, say) silenced
        # everyone else's warnings for the rest of the process
        nncf_log = logging.getLogger("nncf")
        previous = nncf_log.level
        nncf_log.setLevel(logging.ERROR if self.quiet else logging.WARNING)
        sink = open(os.devnull, "w") if self.quiet else contextlib.nullcontext(sys.stderr)  # noqa: SIM115
        try:
            # NNCF draws its progress with rich on stdout: keep stdout for veo-edge's own (--json) output
            with sink as out, contextlib.redirect_stdout(out):
                quantized = nncf.quantize(
                    model,
                    nncf.Dataset(samples),
                    model_type=nncf.ModelType.TRANSFORMER,
                    subset_size=len(samples),
                    advanced_parameters=AdvancedQuantizationParameters(overflow_fix=OverflowFix.ENABLE),
                )
        except Exception as e:  # NNCF raises many kinds; say which stage failed and why
            raise ModelLoadError(f"NNCF could not quantize {fp32_xml}: {type(e).__name__}: {e}") from e
        finally:
            nncf_log.setLevel(previous)
        ov.save_model(quantized, str(int8_xml), compress_to_fp16=False)
        return int8_xml, int8_xml.with_suffix(".bin")

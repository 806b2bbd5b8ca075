"""The build's surgery stage: inject the plugins, prove the result on the CPU, write the artifacts.

Writes ``model.plugins.onnx`` (plugin nodes, no function bodies: TensorRT 10.3's parser would import a
local function in preference to the registered plugin) and ``surgery_report.json``. The proof runs the
reference copy (function bodies attached) in ONNX Runtime on the parity stage's seeded inputs, batch 1
and max batch, against the build's reference, with the FlashAttention-style tolerance of
:func:`veo_edge.export.parity.compare`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.errors import ParityError
from veo_edge.surgery.report import REPORT_NAME, SurgeryReport

PLUGINS_ONNX = "model.plugins.onnx"


@dataclass
class SurgeryOutcome:
    report: SurgeryReport
    artifacts: dict[str, Path] = field(default_factory=dict)  # kind -> path
    notes: list[str] = field(default_factory=list)


def reference_check(
    reference_model: Any,
    plain: Callable[[np.ndarray], np.ndarray],
    reference: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    input_shape: tuple[int, ...],
    batches: tuple[int, ...],
    seed: int,
) -> list[dict[str, Any]]:
    """The injected graph with function bodies vs the build's reference (and the plain ONNX), per batch."""
    from veo_edge.export.parity import compare, seeded_inputs
    from veo_edge.runtime.backends.onnxruntime import OnnxRuntimeRunner

    runner = OnnxRuntimeRunner(reference_model.SerializeToString(), max_batch=max(batches))
    out = []
    with runner:
        for i, batch in enumerate(batches):
            x = seeded_inputs(input_shape, batch, seed + i)
            ref64, out32 = reference(x)
            got = next(iter(runner.infer(x).values()))
            stats = compare("plugins-reference", got, ref64, float(np.abs(out32 - ref64).max()))
            out.append(
                {
                    **stats.to_dict(),
                    "max_abs_vs_plain": float(np.abs(got.astype(np.float64) - plain(x)).max()),
                }
            )
    failed = [c for c in out if not c["passed"]]
    if failed:
        c = failed[0]
        raise ParityError(
            f"the plugin-injected graph does not compute what the plain ONNX computes (batch {c['batch']}: "
            f"max abs {c['max_abs']:.3g} > tolerance {c['tolerance']:.3g}); this is a veo-edge surgery bug: "
            "build with --no-plugins and report it with the model"
        )
    return out


def run_surgery(
    stage: Path,
    onnx_path: Path,
    input_shape: tuple[int, ...],
    plain: Callable[[np.ndarray], np.ndarray],
    reference: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    batches: tuple[int, ...],
    seed: int,
) -> SurgeryOutcome:
    import onnx

    from veo_edge.surgery.inject import PluginInjection

    model = onnx.load(str(onnx_path))
    inj = PluginInjection(input_shape=input_shape)(model)
    report = inj.report
    outcome = SurgeryOutcome(report)
    if report.replaced:
        report.reference_check = reference_check(
            inj.reference_model, plain, reference, input_shape, batches, seed
        )
        path = stage / PLUGINS_ONNX
        onnx.save(inj.plugin_model, str(path))
        outcome.artifacts["plugins_onnx"] = path
    else:
        outcome.notes.append(
            "[bold yellow]WARNING: plugin injection matched nothing[/] in this model: no attention block or "
            "patch embedding was replaced (see surgery_report.json for why). The CPU artifacts are complete; "
            "a TensorRT engine would be built from the plain ONNX without veo-edge's fused kernels."
        )
    outcome.artifacts["surgery_report"] = report.write(stage / REPORT_NAME)
    return outcome

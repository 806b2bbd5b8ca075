"""The build's surgery stage: inject the plugins, prove the result on the CPU, write the artifacts.

Writes ``model.plugins.onnx`` (the canonical graph with the plugin nodes, no function bodies: TensorRT 10.3's parser would import a
local function in preference to the registered plugin) and ``surgery_report.json``. The proof runs the
reference copy (function bodies attached) in ONNX Runtime on the parity stage's seeded inputs, batch 1
and max batch, against the build's reference, with the FlashAttention-style tolerance of
:func:`veo_edge.export.parity.compare`. When that fails, the regions that make it fail are found by
bisection and left unfused (reported as ``whole_graph``); the rest is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from veo_edge.errors import ParityError
from veo_edge.surgery.report import REPORT_NAME, SurgeryReport

if TYPE_CHECKING:
    from veo_edge.surgery.inject import Injection

PLUGINS_ONNX = "model.plugins.onnx"


@dataclass
class SurgeryOutcome:
    report: SurgeryReport
    artifacts: dict[str, Path] = field(default_factory=dict)  # kind -> path
    notes: list[str] = field(default_factory=list)


def reference_checks(
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
    return out


def reference_check(
    reference_model: Any,
    plain: Callable[[np.ndarray], np.ndarray],
    reference: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    input_shape: tuple[int, ...],
    batches: tuple[int, ...],
    seed: int,
) -> list[dict[str, Any]]:
    """:func:`reference_checks`, raising :class:`ParityError` when a batch fails."""
    out = reference_checks(reference_model, plain, reference, input_shape, batches, seed)
    failed = [c for c in out if not c["passed"]]
    if failed:
        c = failed[0]
        raise ParityError(
            f"the plugin-injected graph does not compute what the plain ONNX computes (batch {c['batch']}: "
            f"max abs {c['max_abs']:.3g} > tolerance {c['tolerance']:.3g}); this is a veo-edge surgery bug: "
            "build with --no-plugins and report it with the model"
        )
    return out


def _failure(checks: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((c for c in checks if not c["passed"]), None)


def isolate(
    inj: Injection, check: Callable[[Injection], list[dict[str, Any]]]
) -> tuple[Injection, list[dict[str, Any]], list[int]]:
    """Run the whole-graph ``check``; when it fails, find the regions that make it fail by group testing
    (bisecting the replaced regions: a group whose replacement alone passes is kept) and assemble the
    injection without them. Returns (injection, its checks, indices of the dropped regions)."""
    checks = check(inj)
    if _failure(checks) is None:
        return inj, checks, []
    replaced = [i for i, r in enumerate(inj.report.regions) if r.replaced]
    bad: dict[int, dict[str, Any]] = {}

    def only(ids: list[int]) -> Injection:
        keep = set(ids)
        return inj.without({i: ("whole_graph", "") for i in replaced if i not in keep})

    def search(ids: list[int], known: dict[str, Any] | None) -> None:
        failure = known if known is not None else _failure(check(only(ids)))
        if failure is None:
            return
        if len(ids) == 1:
            bad[ids[0]] = failure
            return
        half = len(ids) // 2
        search(ids[:half], None)
        search(ids[half:], None)

    search(replaced, _failure(checks))
    dropped = {
        i: (
            "whole_graph",
            f"with this region replaced the whole graph differs from the reference (batch {c['batch']}: "
            f"max abs {c['max_abs']:.3g} > tolerance {c['tolerance']:.3g}); left unfused",
        )
        for i, c in bad.items()
    }
    if not dropped:  # every region passes alone, together they do not: fuse none
        c = _failure(checks)
        dropped = {
            i: (
                "whole_graph",
                f"each region passes alone but together they make the whole graph differ from the "
                f"reference (batch {c['batch']}: max abs {c['max_abs']:.3g} > tolerance "
                f"{c['tolerance']:.3g}); none fused",
            )
            for i in replaced
        }
    out = inj.without(dropped)
    checks = check(out) if out.report.replaced else []
    if _failure(checks) is not None:
        c = _failure(checks)
        out = inj.without(
            {
                i: (
                    "whole_graph",
                    f"the regions kept after isolating the failing ones still differ from the reference "
                    f"(max abs {c['max_abs']:.3g} > tolerance {c['tolerance']:.3g}); none fused",
                )
                for i in replaced
            }
        )
        checks = []
    return out, checks, sorted(dropped)


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
    outcome = SurgeryOutcome(inj.report)
    if inj.report.replaced:
        inj, checks, dropped = isolate(
            inj,
            lambda i: reference_checks(i.reference_model, plain, reference, input_shape, batches, seed),
        )
        inj.report.reference_check = checks
        outcome.report = inj.report
        if dropped:
            regions = inj.report.regions
            names = ", ".join(f"{regions[i].op} at {regions[i].anchor!r}" for i in dropped)
            outcome.notes.append(
                f"[bold yellow]WARNING: {len(dropped)} fused region(s) were dropped[/]: with them the "
                f"injected graph did not match the reference ({names}); the rest is fused and proven. "
                "Please report this with the model."
            )
    report = outcome.report
    if report.replaced:
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

"""The CPU precision stage of ``veo-edge build`` (``--cpu-precision f32|bf16|int8``).

After the FP32 artifacts passed parity: resolve the precision on this CPU (bf16 falls back to f32 where
the CPU has no native BF16), quantize the FP32 IR with NNCF for int8 (the FP32 IR stays), run the
accuracy guard (export/accuracy.py) and derive the canary tolerance of the served precision. Everything
lands in the manifest under ``cpu_precision`` (and ``canary.precisions``); a failed guard raises, so the
staged build directory goes and nothing is left under the output name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.errors import InputError, UsageError
from veo_edge.export.accuracy import (
    check_guard_data,
    label_free_guard,
    labelled_guard,
    outputs,
    top1_points,
)
from veo_edge.export.calibration import Data, load_data
from veo_edge.export.canary import MIN_COSINE, Canary, compare_canary
from veo_edge.export.parity import seeded_inputs
from veo_edge.export.source import LoadedModel
from veo_edge.pipeline.progress import StageReporter

#: a reduced precision's canary may be off by this many times the error the build measured for it
CANARY_MARGIN = 4.0
#: seeded held-out inputs of a label-free bf16 check without data
SEEDED_HELD_OUT = 64
HELD_OUT_SEED = 777


@dataclass
class PrecisionResult:
    manifest: dict[str, Any]
    artifacts: dict[str, Path] = field(default_factory=dict)
    canary: dict[str, Any] | None = None  # the served precision's canary tolerance


def _builtin_data(loaded: LoadedModel):
    if not loaded.source.startswith("builtin:"):
        return None
    from veo_edge.models.registry import builtin_data

    return builtin_data(loaded.name)


def _validation(loaded: LoadedModel, val: Data | None) -> Data | None:
    if val is not None:
        return val
    data = _builtin_data(loaded)
    if data is None:
        return None
    test = data.test_split()
    return Data(test.x, test.y, f"{loaded.name} test split: {data.describe_split()}")


def _no_calibration(name: str) -> UsageError:
    return UsageError(
        f"--cpu-precision int8 needs calibration inputs for {name}: pass --calibration PATH "
        "(a .npy/.npz of preprocessed inputs, or a folder of images); only built-in models trained on "
        "real data (vit-digits) bring their own"
    )


def precheck(opts: Any) -> None:
    """The precision options' errors that need no model: raised before any slow work."""
    if opts.calibration is not None and opts.cpu_precision != "int8":
        raise UsageError(f"--calibration goes with --cpu-precision int8, not {opts.cpu_precision}")
    for flag, path in (("--calibration", opts.calibration), ("--val", opts.val)):
        if path is not None and not Path(path).exists():
            raise UsageError(f"{flag} {path} does not exist; expected a .npy/.npz file or a folder of images")
    if opts.cpu_precision == "int8" and opts.calibration is None:
        from veo_edge.export.source import BuiltinSource
        from veo_edge.models.registry import builtin_data

        source = opts.source
        if not isinstance(source, BuiltinSource) or builtin_data(source.name) is None:
            raise _no_calibration(getattr(source, "name", None) or "this model")


@dataclass
class BuildData:
    """The build's own data, read once: ``--val`` (checked against the model) and ``--calibration``."""

    val: Data | None = None
    calibration: Data | None = None


def load_build_data(loaded: LoadedModel, opts: Any) -> BuildData:
    """``--val`` and ``--calibration`` read, right after the model loads: their errors (``--val``'s sample
    count, its labels against the model's classes) come before the export and parity, not after them,
    and each folder of images is decoded once for the whole build."""
    data = BuildData()
    if opts.val is not None:
        data.val = load_data(opts.val, loaded.input_shape, "--val", loaded.preprocess)
        served = loaded.config.get("output") or "logits"
        classes = _classes(loaded) if data.val.labelled and served == "logits" else None
        guarded = opts.cpu_precision != "f32"  # bf16 is guarded on every CPU, also where it runs at f32
        check_guard_data(data.val.source, len(data.val.x), data.val.y, served, classes, guarded)
    if opts.calibration is not None:
        cal = data.calibration = load_data(
            opts.calibration, loaded.input_shape, "--calibration", loaded.preprocess
        )
        if data.val is None and len(cal.x) < 2:  # the label-free guard holds a fifth of it out
            raise InputError(
                f"--calibration {cal.source} has {len(cal.x)} sample; the label-free guard needs at least "
                "2 (a fifth is held out), or pass --val"
            )
    return data


def _classes(loaded: LoadedModel) -> int | None:
    """How many classes the model scores: its labels, else the width of its output."""
    if loaded.labels:
        return len(loaded.labels)
    if loaded.module is not None:
        import torch

        with torch.no_grad():
            out = loaded.module(torch.zeros((1, *loaded.input_shape)))
        return int(out.shape[-1])
    if loaded.onnx_path is not None:
        import onnx

        graph = onnx.load(str(loaded.onnx_path), load_external_data=False).graph
        dims = graph.output[0].type.tensor_type.shape.dim
        return int(dims[-1].dim_value) if dims and dims[-1].dim_value > 0 else None
    return None


def _calibration(loaded: LoadedModel, calibration: Data | None) -> Data:
    if calibration is not None:
        return calibration
    data = _builtin_data(loaded)
    if data is None:
        raise _no_calibration(loaded.name)
    x = data.calibration_set()
    return Data(x, None, f"{loaded.name} training split, first {len(x)}")


def run_precision_stage(
    stage: Path,
    loaded: LoadedModel,
    fp32_xml: Path,
    opts: Any,  # BuildOptions
    rep: StageReporter,
    fp32_runs: dict[str, Any],
    canary: Canary,
    data: BuildData,
) -> PrecisionResult:
    from veo_edge.runtime.backends.openvino import OpenVinoRunner
    from veo_edge.runtime.backends.openvino_compile import resolve_precision

    requested = opts.cpu_precision
    precheck(opts)
    served, note = resolve_precision(requested)
    section: dict[str, Any] = {"requested": requested, "served": {"openvino": served, "onnxruntime": "f32"}}
    if note:
        section["note"] = note
        rep.note(note)
    val = _validation(loaded, data.val)
    batch = opts.max_batch
    if served == "f32":
        if val is not None and val.labelled:
            with rep.stage("accuracy", f"Measuring top-1 accuracy on {len(val.x)} labelled samples"):
                section["accuracy"] = {
                    "data": val.source,
                    "samples": len(val.x),
                    "top1": {
                        b: {"f32": top1_points(outputs(r, val.x, batch), val.y)} for b, r in fp32_runs.items()
                    },
                }
        return PrecisionResult(section)

    result = PrecisionResult(section)
    xml = fp32_xml
    held_out: Data | None = None
    if served == "int8":
        from veo_edge.runtime.probes import probe_int8

        speed = probe_int8()
        if not speed.ok:
            rep.note(f"warning: {speed.reason}")
        from veo_edge.export.quantize import SETTINGS, Int8Quantize

        cal = _calibration(loaded, data.calibration)
        cal_x = cal.x
        if val is None:  # label-free: hold the last fifth of the calibration set out of the calibration
            n_hold = max(1, len(cal.x) // 5)
            cal_x, held_out = (
                cal.x[:-n_hold],
                Data(cal.x[-n_hold:], None, f"{cal.source}, last {n_hold} held out"),
            )
        section["calibration"] = {"data": cal.source, "samples": len(cal_x)}
        section["quantization"] = dict(SETTINGS)
        xml = fp32_xml.with_name("model.int8.xml")
        with rep.stage("quantize", f"Quantizing the OpenVINO IR to INT8 with NNCF ({len(cal_x)} samples)"):
            Int8Quantize(cal_x, quiet=opts.quiet)(fp32_xml, xml)
        result.artifacts = {"openvino_int8_xml": xml, "openvino_int8_bin": xml.with_suffix(".bin")}

    runner = OpenVinoRunner(xml, max_batch=batch, precision=served)
    with runner:
        run = lambda x: next(iter(runner.infer(x).values()))  # noqa: E731
        section["inference_precision_hint"] = runner.compiled_precision
        if val is not None and val.labelled:
            with rep.stage(
                "guard", f"Checking {served} top-1 accuracy against f32 ({len(val.x)} labelled samples)"
            ):
                report = labelled_guard(
                    fp32_runs,
                    ("openvino", run),
                    served,
                    val.x,
                    val.y,
                    batch,
                    opts.max_accuracy_drop,
                    val.source,
                )
        else:
            if val is not None:
                held_out = val
            elif held_out is None:
                x = seeded_inputs(loaded.input_shape, SEEDED_HELD_OUT, HELD_OUT_SEED)
                held_out = Data(x, None, f"{SEEDED_HELD_OUT} seeded inputs (seed {HELD_OUT_SEED})")
            with rep.stage(
                "guard", f"Checking {served} against f32 on {len(held_out.x)} held-out inputs (no labels)"
            ):
                report = label_free_guard(
                    fp32_runs["openvino"], ("openvino", run), served, held_out.x, batch, held_out.source
                )
        section["guard"] = report.to_dict()
        rep.note(f"accuracy guard passed: {report.summary()}")
        result.canary = _canary_tolerance(run(canary.input), canary)
    return result


def _canary_tolerance(out: np.ndarray, canary: Canary) -> dict[str, Any]:
    """The served precision's canary rule: the f32 tolerance plus CANARY_MARGIN times the error the build
    measured at that precision (so a healthy backend passes and a broken one does not)."""
    measured = compare_canary(out, canary)
    atol = canary.atol + CANARY_MARGIN * measured.max_abs
    min_cos = min(MIN_COSINE, 1.0 - CANARY_MARGIN * (1.0 - measured.cosine))
    return {
        "atol": atol,
        "min_cosine": min_cos,
        "measured_max_abs": measured.max_abs,
        "measured_cosine": measured.cosine,
    }


def summary_lines(section: dict[str, Any]) -> list[str]:
    """What ``build`` and ``inspect`` print about the CPU precision."""
    served = section["served"]["openvino"]
    lines = [f"cpu precision: {served} on openvino (asked for {section['requested']}), f32 on onnxruntime"]
    if section.get("note"):
        lines.append(f"note: {section['note']}")
    if section.get("calibration"):
        c = section["calibration"]
        lines.append(f"calibration: {c['samples']} samples ({c['data']})")
    q = section.get("quantization")
    if q:
        lo, hi = q["weight_range"]
        lines.append(
            f"int8 weights within [{lo}, {hi}] ({q['tool']} overflow fix): no int16 saturation on CPUs without VNNI"
        )
    acc = section.get("accuracy")
    if acc:
        per = ", ".join(f"{b} {p} {v:.2f}%" for b, d in acc["top1"].items() for p, v in d.items())
        lines.append(f"top-1 on {acc['samples']} labelled samples ({acc['data']}): {per}")
    guard = section.get("guard")
    if guard:
        from veo_edge.export.accuracy import GuardReport

        lines.append(f"guard ({guard['kind']}): {GuardReport(**guard).summary()}")
    return lines

"""``veo-edge build``: the stages from a model to a verified build directory.

Each stage does its work once and hands what it made to the next: the ONNX file is exported once, each
backend is loaded once and serves both the parity check and the canary.
"""

from __future__ import annotations

import contextlib
import math
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from veo_edge import __version__
from veo_edge.builddir import BuildDir, artifact_entry, write_manifest
from veo_edge.errors import ParityError, UsageError
from veo_edge.export.accuracy import MAX_ACCURACY_DROP
from veo_edge.export.canary import MIN_COSINE, Canary, canary_sample, compare_canary
from veo_edge.export.hf_source import HuggingFaceSource
from veo_edge.export.onnx_export import OUTPUT_NAME, Exporter, OnnxExport, check_onnx
from veo_edge.export.openvino_ir import OpenVinoConvert
from veo_edge.export.parity import ParityStats, TorchReference, check_all
from veo_edge.export.source import BuiltinSource, LoadedModel, ModuleSource, OnnxSource, inline_external_data
from veo_edge.pipeline.progress import StageReporter
from veo_edge.runtime.backends.openvino_compile import SERVED_PRECISIONS
from veo_edge.staging import BuildOutput

if TYPE_CHECKING:
    from veo_edge.pipeline.precision import BuildData

Source = BuiltinSource | ModuleSource | OnnxSource | HuggingFaceSource

#: seed of the golden canary input of a build without data; fixed so every such build has the same one
CANARY_SEED = 20_240_611
PARITY_SEED = 1234


@dataclass(frozen=True)
class BuildOptions:
    source: Source
    out: Path | None = None  # default: ./<model name>
    max_batch: int = 8
    fp16: bool = False
    force: bool = False
    wait: bool = False  # wait for another build of the same --out instead of failing
    quiet: bool = False
    opset: int = 17
    exporter: Exporter = "torchscript"
    plugins: bool = True
    # the CPU precision stage (pipeline/precision.py)
    cpu_precision: str = "f32"  # f32, bf16 or int8
    calibration: Path | None = None
    val: Path | None = None
    max_accuracy_drop: float = MAX_ACCURACY_DROP

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= 1024:
            raise UsageError(f"--max-batch {self.max_batch} is out of range; expected 1..1024")
        if self.cpu_precision not in SERVED_PRECISIONS:
            raise UsageError(
                f"--cpu-precision {self.cpu_precision!r} is unknown; choose one of: {', '.join(SERVED_PRECISIONS)}"
            )
        if not 0 <= self.max_accuracy_drop <= 100:
            raise UsageError(
                f"--max-accuracy-drop {self.max_accuracy_drop} is out of range; expected 0..100 points"
            )


@dataclass
class BuildResult:
    path: Path
    manifest: dict[str, Any]
    parity: list[ParityStats] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"veo-edge": __version__, "python": platform.python_version()}
    for dist in ("torch", "onnx", "onnxruntime", "openvino"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def run_build(opts: BuildOptions) -> BuildResult:
    from veo_edge.pipeline.precision import load_build_data, precheck

    with contextlib.ExitStack() as stack:
        output = None
        if opts.out is not None:  # an explicit --out is checked and locked before any slow work
            output = stack.enter_context(BuildOutput(opts.out, opts.force, opts.wait))
        precheck(opts)
        rep = stack.enter_context(StageReporter(quiet=opts.quiet))
        with rep.stage("load", "Loading the model"):
            loaded = opts.source.load()
            data = load_build_data(loaded, opts)  # refused now, not after the export
        if output is None:
            output = stack.enter_context(BuildOutput(Path.cwd() / loaded.name, opts.force, opts.wait))
        for debris in output.reclaimed:
            rep.note(f"removed {debris}, left by a build of {output.out.name} that was killed")
        with output.staging(need_bytes=estimate_bytes(loaded, opts)) as stage:
            result = _build_into(stage, loaded, opts, rep, data)
        result.path = output.out
        return result


def estimate_bytes(loaded: LoadedModel, opts: BuildOptions) -> int:
    """Roughly the disk space a build of ``loaded`` takes: the weights once in model.onnx, once in
    model.plugins.onnx and once (half with --fp16) in the OpenVINO .bin, plus a margin for the rest."""
    if loaded.module is not None:
        weights = sum(p.numel() * p.element_size() for p in loaded.module.state_dict().values())
    else:
        weights = sum(p.stat().st_size for p in (Path(loaded.onnx_path), *loaded.onnx_external_data))
    copies = 1 + (1 if opts.plugins else 0) + (0.5 if opts.fp16 else 1)
    canary = 2 * 4 * math.prod(loaded.input_shape)  # the canary input and (at most as large) its output
    return int(weights * copies * 1.1) + canary + (256 << 10)  # + the XML, reports and manifest


def _build_into(
    stage: Path, loaded: LoadedModel, opts: BuildOptions, rep: StageReporter, data: BuildData
) -> BuildResult:
    from veo_edge.runtime.backends.onnxruntime import OnnxRuntimeRunner
    from veo_edge.runtime.backends.openvino import OpenVinoRunner

    onnx_path = stage / "model.onnx"
    if loaded.module is not None:
        with rep.stage("export", f"Exporting to ONNX ({opts.exporter}, opset {opts.opset})"):
            OnnxExport(opset=opts.opset, exporter=opts.exporter, max_batch=opts.max_batch)(
                loaded.module, loaded.input_shape, onnx_path, loaded.config.get("output") or OUTPUT_NAME
            )
    else:
        with rep.stage("export", "Checking the ONNX model"):
            if loaded.onnx_external_data:  # one self-contained model.onnx (README: build from an ONNX)
                inline_external_data(loaded.onnx_path, onnx_path)
            else:
                shutil.copyfile(loaded.onnx_path, onnx_path)
            check_onnx(onnx_path)

    xml_path = stage / "openvino" / "model.xml"
    xml_path.parent.mkdir()
    precision = "fp16" if opts.fp16 else "fp32"
    with rep.stage("openvino", f"Converting to OpenVINO IR ({precision})"):
        OpenVinoConvert(fp16=opts.fp16)(onnx_path, xml_path)

    ort = OnnxRuntimeRunner(onnx_path, max_batch=opts.max_batch)
    ov = OpenVinoRunner(xml_path, max_batch=opts.max_batch)
    try:
        runs = {"onnxruntime": lambda x: _only(ort.infer(x)), "openvino": lambda x: _only(ov.infer(x))}
        with rep.stage("parity", "Checking parity with PyTorch (batch 1 and max batch)"):
            ort.activate()
            ov.activate()
            batches = (1, opts.max_batch) if opts.max_batch > 1 else (1,)
            fp16 = frozenset({"openvino"}) if opts.fp16 else frozenset()
            if loaded.module is not None:
                reference: Any = TorchReference(loaded.module)
                parity = check_all(runs, reference, loaded.input_shape, batches, PARITY_SEED, fp16)
            else:
                reference = _OnnxReference(runs.pop("onnxruntime"))
                parity = check_all(runs, reference, loaded.input_shape, batches, PARITY_SEED, fp16)
        with rep.stage("canary", "Recording the golden canary"):
            sample = canary_sample(loaded, data.calibration, data.val, CANARY_SEED)
            canary = _write_canary(stage, sample, reference, runs, parity)
        from veo_edge.pipeline.precision import run_precision_stage

        golden = Canary(
            np.load(stage / canary["input"]), np.load(stage / canary["expected"]), canary["atol"], MIN_COSINE
        )
        fp32_runs = {"openvino": runs["openvino"], "onnxruntime": lambda x: _only(ort.infer(x))}
        cpu = run_precision_stage(stage, loaded, xml_path, opts, rep, fp32_runs, golden, data)
        if cpu.canary is not None:
            canary["precisions"] = {cpu.manifest["served"]["openvino"]: cpu.canary}
        surgery = None
        if opts.plugins:
            from veo_edge.surgery.stage import run_surgery

            with rep.stage("surgery", "Injecting the TensorRT plugins and checking them on the CPU"):
                plain = lambda x: _only(ort.infer(x)).astype(np.float64)  # noqa: E731
                surgery = run_surgery(
                    stage, onnx_path, loaded.input_shape, plain, reference, batches, PARITY_SEED
                )
            for note in surgery.notes:
                rep.note(note)
        inputs = [m.to_dict() for m in ort.input_metadata()]
        outputs = [m.to_dict() for m in ort.output_metadata()]
    finally:
        ort.deactivate()
        ov.deactivate()

    artifacts = {
        "onnx": artifact_entry(stage, onnx_path),
        "openvino_xml": artifact_entry(stage, xml_path),
        "openvino_bin": artifact_entry(stage, xml_path.with_suffix(".bin")),
        "canary_input": artifact_entry(stage, stage / "canary" / "input.npy"),
        "canary_expected": artifact_entry(stage, stage / "canary" / "expected.npy"),
        **{kind: artifact_entry(stage, path) for kind, path in cpu.artifacts.items()},
    }
    manifest: dict[str, Any] = {
        "model": {"name": loaded.name, "source": loaded.source, "config": loaded.config},
        "inputs": [_dynamic(m) for m in inputs],
        "outputs": [_dynamic(m) for m in outputs],
        "input_shape": list(loaded.input_shape),
        "max_batch": opts.max_batch,
        "precision": precision,
        "cpu_precision": cpu.manifest,
        "export": {
            "exporter": opts.exporter if loaded.module is not None else "external",
            "opset": opts.opset,
        },
        "artifacts": artifacts,
        "parity": [s.to_dict() for s in parity],
        "canary": canary,
        "versions": versions(),
        "timings_s": rep.timings,
    }
    if loaded.labels:
        manifest["labels"] = list(loaded.labels)
    if loaded.preprocess:
        manifest["preprocess"] = loaded.preprocess
    if surgery is not None:
        artifacts.update({kind: artifact_entry(stage, path) for kind, path in surgery.artifacts.items()})
        manifest["surgery"] = surgery.report.summary()
    plugin_lib = _plugin_library()
    if plugin_lib is not None:
        manifest["plugin_library"] = plugin_lib
    write_manifest(stage, manifest)
    notes = [*loaded.notes, *(surgery.notes if surgery else [])]
    return BuildResult(path=stage, manifest=manifest, parity=parity, notes=notes)


def _only(outputs: dict[str, np.ndarray]) -> np.ndarray:
    return next(iter(outputs.values()))


def _dynamic(meta: dict[str, Any]) -> dict[str, Any]:
    """Manifest form of a tensor: -1 marks the dynamic batch axis (as KServe and Triton write it)."""
    return {**meta, "shape": [-1 if d is None else d for d in meta["shape"]]}


class _OnnxReference:
    """For an ONNX model made elsewhere there is no PyTorch: ONNX Runtime on the CPU is the reference,
    and the baseline is the float32 rounding of its own output."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = self.run(x).astype(np.float64)
        eps = float(np.finfo(np.float32).eps) * 64 * (float(np.abs(out).max()) or 1.0)
        return out, out + eps  # a baseline of 64 ulp of the largest output

    def fp16_weights(self, x: np.ndarray) -> np.ndarray:
        out, _ = self(x)
        return out + float(np.finfo(np.float16).eps) * 8 * (float(np.abs(out).max()) or 1.0)


def _write_canary(
    stage: Path,
    sample: tuple[np.ndarray, dict[str, Any]],
    reference: Any,
    runs: dict[str, Any],
    parity: list[ParityStats],
) -> dict[str, Any]:
    """A real input where the build has one (:func:`~veo_edge.export.canary.canary_sample`) and its
    expected (PyTorch float32) output, which every backend must reproduce within the build's batch-1
    parity tolerance, by the rule the healthcheck applies later."""
    x, described = sample
    ref64, expected = reference(x)
    atol = max(s.tolerance for s in parity if s.batch == 1)
    # the expected output is float32, so allow for its own rounding against the float64 reference
    atol += float(np.abs(expected.astype(np.float64) - ref64).max())
    canary = Canary(x, expected.astype(np.float32), atol, MIN_COSINE)
    for name, run in runs.items():
        result = compare_canary(run(x), canary)
        if not result.ok:
            raise ParityError(f"canary check failed on {name}: {result.reason}")
    (stage / "canary").mkdir()
    np.save(stage / "canary" / "input.npy", x)
    np.save(stage / "canary" / "expected.npy", expected.astype(np.float32))
    return {
        "input": "canary/input.npy",
        "expected": "canary/expected.npy",
        **described,
        "atol": atol,
        "min_cosine": MIN_COSINE,
    }


def _plugin_library() -> dict[str, Any] | None:
    """Path and sha256 of the TensorRT plugin library, when one has been built (see plugins/)."""
    try:
        from veo_edge.engine.plugin_library import find_plugin_library
    except ImportError:  # the plugin library module is not there yet
        return None
    lib = find_plugin_library()
    return None if lib is None else lib.to_manifest()


def open_build(path: str | Path) -> BuildDir:
    return BuildDir.open(path)

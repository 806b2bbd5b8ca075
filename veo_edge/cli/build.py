"""``veo-edge build``: model -> verified ONNX, OpenVINO IR, canary, manifest."""

from __future__ import annotations

from pathlib import Path

import typer

from veo_edge.cli._common import console, interrupt_on_signals, print_json


def build(
    model: str = typer.Option(
        None, "--model", "-m", help="Built-in model (default: vit-digits); see `veo-edge models`."
    ),
    module: str = typer.Option(None, "--module", help="Your model: pkg.mod:factory returning an nn.Module."),
    onnx: Path = typer.Option(None, "--onnx", help="An existing ONNX ViT to build from."),
    hf: str = typer.Option(
        None,
        "--hf",
        help="A Hugging Face checkpoint: a save_pretrained directory, or a hub id in the local cache.",
    ),
    attn_implementation: str = typer.Option(
        None, "--attn-implementation", help="With --hf: transformers' attention, eager or sdpa."
    ),
    no_preprocess: bool = typer.Option(
        False,
        "--no-preprocess",
        help="With --hf: record no preprocessing (the build takes tensors, not pictures), e.g. for a "
        "processor veo-edge does not reproduce.",
    ),
    checkpoint: Path = typer.Option(
        None, "--checkpoint", help="state_dict for --module or a built-in --model (.pt/.pth/.safetensors)."
    ),
    input_shape: str = typer.Option(None, "--input-shape", help="One sample without batch, e.g. 3,224,224."),
    out: Path = typer.Option(None, "--out", "-o", help="Build directory (default: ./<model name>)."),
    max_batch: int = typer.Option(8, "--max-batch", help="Largest batch the build serves."),
    fp16: bool = typer.Option(False, "--fp16", help="FP16 artifacts (OpenVINO weights compressed to FP16)."),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing build directory (only a veo-edge build is replaced)."
    ),
    wait: bool = typer.Option(
        False, "--wait", help="If another build is writing the same --out, wait for it instead of failing."
    ),
    opset: int = typer.Option(17, "--opset", help="ONNX opset (17 or newer)."),
    exporter: str = typer.Option(
        "torchscript", "--exporter", help="torch.onnx exporter: torchscript or dynamo."
    ),
    no_plugins: bool = typer.Option(False, "--no-plugins", help="Skip injecting the TensorRT plugins."),
    cpu_precision: str = typer.Option(
        "f32", "--cpu-precision", help="OpenVINO precision served on the CPU: f32, bf16 or int8 (NNCF PTQ)."
    ),
    calibration: Path = typer.Option(
        None, "--calibration", help="int8 calibration inputs: .npy/.npz or a folder of images."
    ),
    val: Path = typer.Option(
        None, "--val", help="Labelled validation data for the accuracy guard: .npz with x and y."
    ),
    max_accuracy_drop: float = typer.Option(
        0.2, "--max-accuracy-drop", help="Most top-1 accuracy (points) bf16/int8 may lose against f32."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    json_out: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    # --- container image (veo_edge/cli/image.py does the work)
    target: str = typer.Option(None, "--target", "-t", help="Also make the image: orin, a100 or cpu."),
    image: str = typer.Option(None, "--image", help="Image tag (default: veo-edge/MODEL:VERSION-TARGET)."),
    save: Path = typer.Option(None, "--save", help="Also write the image to this file (docker save)."),
    context_only: bool = typer.Option(False, "--context-only", help="Stop after the image's build context."),
    base_image: str = typer.Option(None, "--base-image", help="Image base (default: the target's)."),
    sign_key: Path = typer.Option(
        None, "--sign-key", help="Ed25519 PEM key signing the image (default: the local key)."
    ),
    platform: str = typer.Option(
        None, "--platform", help="Image platform: linux/amd64 or linux/arm64 (default: the target's)."
    ),
    plugin_libs: bool = typer.Option(
        True,
        "--plugin-libs/--no-plugin-libs",
        help="GPU targets: leave the plugin libraries out (CPU path only).",
    ),
) -> None:
    """Export a ViT to ONNX, prove it matches PyTorch, and write a build directory."""
    from veo_edge.errors import UsageError
    from veo_edge.export.source import BuiltinSource, ModuleSource, OnnxSource, parse_input_shape
    from veo_edge.models import DEFAULT_MODEL
    from veo_edge.pipeline.build import BuildOptions, run_build

    chosen = [
        flag
        for flag, v in (("--model", model), ("--module", module), ("--onnx", onnx), ("--hf", hf))
        if v is not None
    ]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} were both given; choose one model source")
    if checkpoint is not None and (onnx is not None or hf is not None):
        raise UsageError(
            f"--checkpoint goes with --module or --model, not {'--onnx' if onnx else '--hf'} "
            "(it has its weights)"
        )
    if input_shape is not None and module is None:
        given = "--onnx" if onnx else "--hf" if hf else "--model"
        raise UsageError(
            f"--input-shape goes with --module; a {given} build takes the input its model declares "
            f"({'the ONNX graph' if onnx else 'the checkpoint config and processor' if hf else 'the built-in model'})"
        )
    if attn_implementation is not None:
        if hf is None:
            raise UsageError("--attn-implementation goes with --hf")
        if attn_implementation not in ("eager", "sdpa"):
            raise UsageError(f"--attn-implementation {attn_implementation!r}; choose eager or sdpa")
    if no_preprocess and hf is None:
        raise UsageError(
            "--no-preprocess goes with --hf (other sources record no preprocessing of their own)"
        )
    image_flags = [
        f
        for f, v in (
            ("--image", image),
            ("--save", save),
            ("--context-only", context_only),
            ("--base-image", base_image),
            ("--sign-key", sign_key),
            ("--platform", platform),
            ("--no-plugin-libs", not plugin_libs),
        )
        if v
    ]
    if image_flags and target is None:
        raise UsageError(f"{', '.join(image_flags)} need --target orin|a100|cpu")
    if target is not None:
        from veo_edge.packaging.platforms import for_platform
        from veo_edge.targets import get_target

        for_platform(get_target(target), platform)  # an unknown target or platform fails before the export
        from veo_edge.packaging.image import check_image_flags

        check_image_flags(image, base_image)  # a name Docker refuses: now, not after the build and image
        if not context_only:
            from veo_edge.packaging.image import connect

            connect(timeout=30, building=True).close()  # no engine: one line now, not after the export
    shape = parse_input_shape(input_shape)
    if module is not None:
        source = ModuleSource(module, input_shape=shape, checkpoint=checkpoint)
    elif onnx is not None:
        source = OnnxSource(onnx)
    elif hf is not None:
        from veo_edge.export.hf_source import HuggingFaceSource

        source = HuggingFaceSource(hf, attn_implementation, pictures=not no_preprocess)
    else:
        source = BuiltinSource(model or DEFAULT_MODEL, checkpoint=checkpoint)
    opts = BuildOptions(
        source=source,
        out=out,
        max_batch=max_batch,
        fp16=fp16,
        force=force,
        wait=wait,
        quiet=quiet or json_out,
        opset=opset,
        exporter=exporter,
        plugins=not no_plugins,
        cpu_precision=cpu_precision,
        calibration=calibration,
        val=val,
        max_accuracy_drop=max_accuracy_drop,
    )
    from veo_edge.errors import OutputExistsError

    with interrupt_on_signals():  # SIGTERM cleans up as Ctrl-C does: no staging directory or lock left
        try:
            result = run_build(opts)
        except OutputExistsError as e:
            raise _finish_image_hint(e, target, image) from None
        if target is not None:
            from veo_edge.cli.image import package

            result.manifest["image"] = package(
                result.path,
                target,
                image,
                save,
                context_only,
                base_image,
                sign_key,
                force=force,
                quiet=quiet or json_out,
                platform=platform,
                plugin_libs=plugin_libs,
            )
    if json_out:
        print_json({"path": str(result.path), **result.manifest})
        return
    if quiet:
        return
    c = console()
    for note in result.notes:
        c.print(note)
    worst = max(result.parity, key=lambda s: s.max_rel)
    arts = result.manifest["artifacts"]
    c.print(
        f"[bold green]Built {result.manifest['model']['name']}[/] in {sum(result.manifest['timings_s'].values()):.1f} s "
        f"-> {result.path}"
    )
    c.print(
        f"  parity: worst max abs {worst.max_abs:.2g} ({worst.candidate}, batch {worst.batch}), all within tolerance"
    )
    cpu = result.manifest.get("cpu_precision")
    if cpu and (cpu["requested"] != "f32" or cpu.get("accuracy")):
        from veo_edge.pipeline.precision import summary_lines

        for line in summary_lines(cpu):
            c.print(f"  {line}", soft_wrap=True, markup=False)
    if "surgery" in result.manifest:
        from veo_edge.surgery.report import SurgeryReport

        report = SurgeryReport.read(result.path / arts["surgery_report"]["path"])
        for line in report.lines():
            c.print(f"  {line}", soft_wrap=True, markup=False)
    for kind in arts:
        c.print(f"  {kind:<16} {result.path / arts[kind]['path']}")
    shipped = (result.manifest.get("image") or {}).get("image")
    if shipped:  # an image was made: checking and shipping it comes next
        c.print(
            f"Next: [bold]veo-edge verify {shipped}[/], then [bold]veo-edge deploy {shipped} --to ENGINE[/]"
        )
    else:
        c.print(f"Next: [bold]veo-edge infer {result.path}{_example_input(result.manifest)}[/]")


def _finish_image_hint(e: Exception, target: str | None, image: str | None) -> Exception:
    """A finished build in the way of ``build --target`` (its image build was interrupted or failed):
    point to ``veo-edge image build``, which makes the image from it, before --force (which rebuilds)."""
    from veo_edge.errors import OutputExistsError

    details = getattr(e, "details", None) or {}
    if target is None or not details.get("finished_build"):
        return e
    img = f" --image {image}" if image else ""
    err = OutputExistsError(
        f"build directory {details['path']} already exists and is a finished build; to make its image run "
        f"`veo-edge image build {details['path']} --target {target}{img}`, or pass --force to rebuild the "
        "model as well"
    )
    err.details = details
    return err


def _example_input(manifest: dict) -> str:
    """What to feed ``infer`` first: a picture or a clip where the build records its preprocessing
    (otherwise nothing: infer then runs seeded random input of the model's shape)."""
    prep = manifest.get("preprocess")
    if not prep:
        return ""
    return " --video CLIP.mp4" if prep.get("num_frames") else " --image PICTURE.jpg"


def register(app: typer.Typer) -> None:
    app.command("build")(build)

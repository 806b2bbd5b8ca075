"""``veo-edge engine build``: build (or refresh) the TensorRT engine of a build directory on this GPU."""

from __future__ import annotations

from pathlib import Path

import typer

from veo_edge.cli._common import console, print_json

app = typer.Typer(help="TensorRT engines of a build directory (GPU hosts).", no_args_is_help=True)


@app.command("build")
def build_engine(
    build_dir: Path = typer.Argument(..., help="A build directory made by `veo-edge build`."),
    precision: str = typer.Option(None, "--precision", help="fp32 or fp16 (default: the build's precision)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when a matching engine is cached."),
    cache: Path = typer.Option(
        None, "--cache-dir", help="Engine cache (default: $VEO_EDGE_ENGINE_CACHE or BUILD_DIR/engines)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Build the engine from the build's plugins_onnx (or plain ONNX) for this GPU and cache it."""
    from veo_edge.builddir import BuildDir
    from veo_edge.runtime.backends.tensorrt import default_config, load_or_build_engine

    build = BuildDir.open(build_dir)
    config = default_config(build, precision)
    _, _, engine, entry, origin = load_or_build_engine(build, config, force=force, cache=cache)
    result = {
        "engine": str(entry.engine),
        "origin": origin,
        "precision": config.precision,
        "max_batch": config.max_batch,
        "device_memory_size": int(engine.device_memory_size_v2),
        "key": entry.read_meta()["key"],
    }
    if json_out:
        print_json(result)
        return
    console().print(f"TensorRT engine ({origin}): {entry.engine}")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="engine")

"""``veo-edge engine build``: build (or refresh) the TensorRT engines of a build directory on this GPU, and
choose the one that serves (see :mod:`veo_edge.engine.selection`)."""

from __future__ import annotations

from pathlib import Path

import typer

from veo_edge.cli._common import console, print_json

app = typer.Typer(help="TensorRT engines of a build directory (GPU hosts).", no_args_is_help=True)


@app.command("build")
def build_engine(
    build_dir: Path = typer.Argument(..., help="A build directory made by `veo-edge build`."),
    precision: str = typer.Option(None, "--precision", help="fp32 or fp16 (default: the build's precision)."),
    engine: str = typer.Option(
        "fastest",
        "--engine",
        help="Which engine serves: fastest (build both, keep the faster equivalent one), plugins, plain.",
    ),
    gpu: int = typer.Option(0, "--gpu", min=0, help="CUDA device index to build and time on."),
    pool_factor: float = typer.Option(
        None,
        "--pool-factor",
        help="Memory pool reservation, x the max-batch activation + I/O need (default 4).",
    ),
    reps: int = typer.Option(
        50, "--reps", min=1, help="Timed runs per engine and batch (the median is kept)."
    ),
    warmup: int = typer.Option(10, "--warmup", min=0, help="Untimed runs before timing."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when a matching engine is cached."),
    cache: Path = typer.Option(
        None, "--cache-dir", help="Engine cache (default: $VEO_EDGE_ENGINE_CACHE or BUILD_DIR/engines)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Build the engines for this GPU, compare and time them, record which one serves, and cache them."""
    from veo_edge.builddir import BuildDir
    from veo_edge.runtime.backends.tensorrt import _cuda_check, _cudart, _trt, default_config, select_engine
    from veo_edge.runtime.backends.tensorrt_engine import model_source

    build = BuildDir.open(build_dir)
    for variant in ("plugins", "plain"):  # the engine sources are verified first, TensorRT or not
        model_source(build, variant)
    _trt()  # TensorRT's absence is the reason a user most needs to read
    extra = {"pool_factor": pool_factor} if pool_factor is not None else {}
    config = default_config(build, precision, engine=engine, **extra)
    c = console()
    _cuda_check(_cudart().cudaSetDevice(gpu), f"selecting GPU {gpu}")
    decision, blobs = select_engine(
        build,
        config,
        force=force,
        cache=cache,
        gpu=gpu,
        warmup=warmup,
        reps=reps,
        progress=(lambda _msg: None) if json_out else (lambda msg: c.print(msg, markup=False)),
    )
    result = {
        "chosen": decision.chosen,
        "decision": decision.to_dict(),
        "precision": config.precision,
        "max_batch": config.max_batch,
        "pool_factor": config.pool_factor,
        "engines": {
            v: {"engine": str(b.entry.engine), "origin": b.origin, "device_memory_size": b.device_memory_size}
            for v, b in blobs.items()
        },
    }
    if json_out:
        print_json(result)
        return
    chosen = blobs[decision.chosen]
    c.print(
        f"TensorRT engine serving: {decision.chosen} ({chosen.origin}): {chosen.entry.engine}", markup=False
    )


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="engine")

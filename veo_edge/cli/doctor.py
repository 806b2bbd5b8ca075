"""``veo-edge doctor``: what this machine can do, each missing piece with its reason."""

from __future__ import annotations

import typer

from veo_edge.cli._common import console, print_json

#: what a failed probe means where it is not a missing component
_MISSING = {"int8": "slow", "bf16": "f32"}


def doctor(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Probe CPU (and whether it runs int8 fast: VNNI or AMX; bf16 natively: AVX512-BF16 or AMX),
    GPU/driver (NVML), TensorRT, ONNX Runtime, OpenVINO and the Docker engine."""
    from veo_edge.runtime.probes import probe_all

    probes = probe_all()
    if json_out:
        print_json({p.name: p.to_dict() for p in probes})
        return
    from rich.table import Table

    table = Table(title="veo-edge doctor")
    table.add_column("component")
    table.add_column("status")
    table.add_column("details")
    for p in probes:
        status = "[green]ok[/]" if p.ok else f"[yellow]{_MISSING.get(p.name, 'absent')}[/]"
        table.add_row(p.name, status, p.detail if p.ok else (p.reason or ""))
    console().print(table)


def models(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List the built-in models."""
    from veo_edge.models import DEFAULT_MODEL, get_config, list_models
    from veo_edge.models.registry import pretrained_weights

    rows = {name: get_config(name).to_dict() for name in list_models()}
    if json_out:
        print_json(rows)
        return
    c = console()
    for name, cfg in rows.items():
        kind = f"video {cfg['num_frames']} frames" if cfg["num_frames"] else "image"
        mark = " (default)" if name == DEFAULT_MODEL else ""
        c.print(
            f"{name}{mark}: {kind} {cfg['img_size']}², {cfg['embed_dim']}-dim, {cfg['depth']} blocks, "
            f"{cfg['num_heads']} heads, {cfg['num_classes']} classes"
            + (", trained weights" if pretrained_weights(name) else "")
        )


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    app.command("models")(models)

"""``veo-edge inspect``: what a build directory holds, and what the plugin surgery did to it."""

from __future__ import annotations

from pathlib import Path

import typer

from veo_edge.cli._common import console, print_json


def inspect(
    build_dir: Path = typer.Argument(..., help="A build directory made by `veo-edge build`."),
    json_out: bool = typer.Option(
        False, "--json", help="Print the manifest summary and surgery report as JSON."
    ),
) -> None:
    """Show a build's manifest summary and its surgery report (what was fused, and why not elsewhere)."""
    from veo_edge.builddir import BuildDir
    from veo_edge.engine.cache import cache_dir, read_choices
    from veo_edge.surgery.report import SurgeryReport

    b = BuildDir.open(build_dir)
    m = b.manifest
    report = SurgeryReport.read(b.artifact("surgery_report")) if b.has("surgery_report") else None
    summary = {
        "path": str(b.path),
        "model": m["model"]["name"],
        "source": m["model"].get("source"),
        "input_shape": m.get("input_shape"),
        "max_batch": m.get("max_batch"),
        "precision": m.get("precision"),
        "cpu_precision": m.get("cpu_precision"),
        "canary_source": (m.get("canary") or {}).get("source"),
        "canary_tolerances": {
            "f32": {k: (m.get("canary") or {}).get(k) for k in ("atol", "min_cosine")},
            **((m.get("canary") or {}).get("precisions") or {}),
        },
        "export": m.get("export"),
        "parity": m.get("parity"),
        # what the model serves when it is not its class scores (CLIP's image_embeds, a pooled output)
        "serves": ((m["model"].get("config") or {}).get("output")),
        "labels": m.get("labels"),
        "preprocess": m.get("preprocess"),
        "artifacts": sorted(m.get("artifacts", {})),
        # missing or resized files (a stat each, no hashing: `veo-edge verify` hashes them)
        "artifact_problems": b.file_problems(),
        "engine_choices": read_choices(cache_dir(b.path), m["model"]["name"]),
    }
    if json_out:
        print_json({**summary, "surgery": None if report is None else report.to_dict()})
    else:
        _show(b, summary, report)
    if summary["artifact_problems"]:  # shown first; then an error (exit 7), as serve, infer, verify give
        from veo_edge.errors import BuildDirError

        problems = "; ".join(summary["artifact_problems"])
        raise BuildDirError(
            f"build {b.path} is incomplete: {problems}; rebuild with `veo-edge build --force`"
        )


def _show(b, summary: dict, report) -> None:
    """The summary and the surgery report as text."""
    from rich.table import Table

    c = console()
    c.print(f"[bold]{summary['model']}[/] ({summary['source']}) at {b.path}")
    exp = summary["export"] or {}
    c.print(
        f"  input {summary['input_shape']}, max batch {summary['max_batch']}, {summary['precision']}, "
        f"exported by {exp.get('exporter')} at opset {exp.get('opset')}"
    )
    if summary["serves"]:
        c.print(f"  serves: {summary['serves']} (features, not class scores)", markup=False)
    c.print(f"  artifacts: {', '.join(summary['artifacts'])}")
    if summary["parity"]:
        c.print(f"  {_parity_line(summary['parity'])}", soft_wrap=True, markup=False)
    for problem in summary["artifact_problems"]:
        c.print(f"  {problem}", style="bold red", soft_wrap=True, markup=False)
    _print_inputs(c, summary)
    _print_engine_choices(c, summary["engine_choices"])
    if summary["cpu_precision"]:
        from veo_edge.pipeline.precision import summary_lines

        for line in summary_lines(summary["cpu_precision"]):
            c.print(f"  {line}", soft_wrap=True, markup=False)
        if summary["canary_source"]:
            c.print(f"  canary input: {summary['canary_source']}", soft_wrap=True, markup=False)
        for p, tol in summary["canary_tolerances"].items():
            c.print(
                f"  canary tolerance at {p}: max abs {tol['atol']:.3g}, cosine >= {tol['min_cosine']:.6f}"
            )
    if report is None:
        c.print("  no plugin surgery in this build (built with --no-plugins or by an older veo-edge)")
        return
    table = Table(title="Plugin surgery")
    for col in ("op", "candidates", "matched", "replaced"):
        table.add_column(col)
    for op, counts in report.counts().items():
        table.add_row(op, *(str(counts[k]) for k in ("candidates", "matched", "replaced")))
    c.print(table)
    for line in report.lines():
        if not line.startswith(("VeoAttention:", "VeoPatchEmbedLayerNorm:")):
            c.print(f"  {line}", soft_wrap=True, markup=False)


def _parity_line(rows: list) -> str:
    """The parity proof in one line: per backend its worst error against the float64 PyTorch reference,
    beside the tolerance it had, over the batch sizes checked."""
    parts = []
    for backend in dict.fromkeys(r["candidate"] for r in rows):
        mine = [r for r in rows if r["candidate"] == backend]
        worst = max(mine, key=lambda r: r["max_abs"] / r["tolerance"])
        ok = "passed" if all(r["passed"] for r in mine) else "FAILED"
        parts.append(
            f"{backend} max abs {worst['max_abs']:.3g} <= {worst['tolerance']:.3g}, cosine >= "
            f"{min(r['min_cosine'] for r in mine):.6f} ({ok})"
        )
    batches = sorted({r["batch"] for r in rows})
    return f"parity vs float64 PyTorch at batch {', '.join(map(str, batches))}: {'; '.join(parts)}"


def _print_inputs(c, summary: dict) -> None:
    """The build's preprocessing and class labels (manifest 1.1), when it has them."""
    from veo_edge.preprocess import Preprocess

    if summary["preprocess"]:
        line = Preprocess.from_manifest(summary["preprocess"]).describe()
        c.print(f"  preprocessing: {line}", markup=False, soft_wrap=True)
    labels = summary["labels"]
    if labels:
        shown = ", ".join(labels[:8]) + (f", ... ({len(labels)} in all)" if len(labels) > 8 else "")
        c.print(f"  labels: {shown}", markup=False, soft_wrap=True)


def _print_engine_choices(c, choices: list) -> None:
    """The TensorRT engine decisions recorded by `veo-edge engine build` (one per GPU, TensorRT, precision)."""
    from veo_edge.engine.selection import Decision

    for rec in choices:
        key = rec["model_keys"]["plain"]
        c.print(
            f"  TensorRT on {key['gpu_name']} (sm {key['compute_capability']}, TensorRT {key['trt_version']}, "
            f"{key['precision']}, batch 1..{key['max_batch']}):",
            markup=False,
        )
        for line in Decision.from_dict(rec["decision"]).lines():
            c.print(f"    {line}", markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)

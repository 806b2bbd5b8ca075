"""``veo-edge verify TARGET``: check what would be loaded against its manifest, on demand.

TARGET is a build directory today; :func:`verify_target` is where other kinds of target (a container
image) are told apart, so the command stays one line of wiring per kind.
"""

from __future__ import annotations

from typing import Any

import typer

from veo_edge.cli._common import console, print_json


def verify_target(target: str, progress: bool | None = None) -> dict[str, Any]:
    """Verify ``target`` and return its report as a dict; raises the target's verification error."""
    from veo_edge.builddir import verify

    return verify(target, progress=progress).to_dict()


def verify_command(
    target: str = typer.Argument(..., help="A build directory made by `veo-edge build`."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON (on failure too)."),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No progress bar and no output; the exit code says."
    ),
    progress: bool = typer.Option(
        None,
        "--progress/--no-progress",
        help="A progress bar on stderr (default: on a terminal, for builds of 256 MiB or more).",
        show_default=False,
    ),
) -> None:
    """Check the manifest against its schema and every artifact against the manifest's sha256 and size.

    Exit codes: 0 intact; 30 an artifact differs from the manifest (the line names the file and both
    hashes); 31 the manifest does not follow its schema; 7 not a build directory or an artifact is missing.
    """
    report = verify_target(target, progress=False if quiet else progress)
    if json_out:
        print_json(report)
        return
    if quiet:
        return
    c = console()
    mib = report["bytes"] / (1 << 20)
    c.print(
        f"[bold green]verified[/] {report['path']}: {len(report['artifacts'])} artifacts, {mib:.1f} MiB, "
        f"every sha256 matches the manifest (schema v{report['schema_version']}, {report['seconds']:.2f} s)",
        soft_wrap=True,
    )
    for a in report["artifacts"]:
        c.print(f"  ok  {a['kind']:<18} {a['path']:<28} {a['sha256'][:16]}…", markup=False)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_command)

"""``veo-edge verify TARGET``: check what would be loaded against its manifest, on demand.

TARGET is a build directory, an image root directory (``/opt/veo-edge`` inside a veo-edge container: the
entrypoint runs this before serving) or a container image in the Docker engine (tag or id, read through
the engine without running it). :func:`verify_target` tells them apart, one line of wiring per kind.
"""

from __future__ import annotations

from typing import Any

import typer

from veo_edge.cli._common import console, print_json


def verify_target(target: str, progress: bool | None = None, key: str | None = None) -> dict[str, Any]:
    """Verify ``target`` and return its report as a dict (``kind``: build or image); raises the target's
    verification error. ``key`` pins an image's signing key."""
    from pathlib import Path

    from veo_edge.packaging import manifest as image_manifest

    path = Path(target)
    if path.is_dir() and (path / image_manifest.MANIFEST_FILE).is_file():
        return {"kind": "image", **image_manifest.verify_root(path, key)}
    # an image is named with a tag or digest (NAME:TAG, NAME@sha256:..., an id sha256:...); anything else
    # is a path, so a mistyped build directory gets "does not exist", not an engine error
    if path.exists() or not (":" in target or "@" in target):
        from veo_edge.builddir import verify

        return {"kind": "build", **verify(target, progress=progress).to_dict()}
    from veo_edge.packaging.image import verify_image

    return {"kind": "image", **verify_image(target, key)}


def verify_command(
    target: str = typer.Argument(
        ..., help="A build directory, an image root directory, or an image in the Docker engine (tag or id)."
    ),
    key: str = typer.Option(
        None,
        "--key",
        help="Images: the trusted signing key, sha256:... fingerprint or PEM public key (or $VEO_EDGE_TRUSTED_KEY).",
    ),
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

    An image: every file baked under /opt/veo-edge against the image manifest, and the manifest's DSSE
    signature (pinned with --key).

    Exit codes: 0 intact; 30 an artifact differs from the manifest (the line names the file and both
    hashes); 31 the manifest does not follow its schema; 7 not a build directory or an artifact is missing;
    43 an image's files or signature do not match; 41 no Docker engine for an image.
    """
    report = verify_target(target, progress=False if (quiet or json_out) else progress, key=key)
    if json_out:
        print_json(report)
        return
    if quiet:
        return
    c = console()
    if report["kind"] == "image":
        signed = f"signed by {report['signed_by']}" if report["signed_by"] else "UNSIGNED"
        c.print(
            f"[bold green]verified[/] {report['source']}: {report['files']} files, {report['bytes'] / 1e6:.1f} MB, "
            f"every sha256 matches the image manifest; {signed}",
            soft_wrap=True,
        )
        return
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

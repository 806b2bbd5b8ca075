"""``veo-edge verify TARGET``: check what would be loaded against its manifest, on demand.

TARGET is a build directory, an image root directory (``/opt/veo-edge`` inside a veo-edge container: the
entrypoint runs this before serving) or a container image in the Docker engine (tag or id, read through
the engine without running it). :func:`verify_target` tells them apart, one line of wiring per kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from veo_edge.cli._common import console, print_json


def verify_target(
    target: str,
    progress: bool | None = None,
    key: str | None = None,
    signature: Path | None = None,
    allow_unsigned: bool = False,
    cache: str | None = None,
) -> dict[str, Any]:
    """Verify ``target`` and return its report as a dict (``kind``: build or image); raises the target's
    verification error. ``key`` pins an image's signing key; ``cache`` is the cache directory (an image
    root) or volume (an image) to check for planted files."""
    from veo_edge.errors import VeoEdgeError
    from veo_edge.packaging import manifest as image_manifest

    if key is not None:  # a short fingerprint or a missing file is a mistake of the command line: say so now
        from veo_edge.packaging.imagetrust import check_key

        check_key(key)
    path = Path(target)
    if path.is_dir() and (path / image_manifest.MANIFEST_FILE).is_file():
        report = image_manifest.verify_root(path, key, Path(cache) if cache else None, allow_unsigned)
        return {"kind": "image", **report}
    # an image is named with a tag or digest (NAME:TAG, NAME@sha256:..., an id sha256:...); anything else
    # is a path, so a mistyped build directory gets "does not exist", not an engine error
    if path.exists() or not (":" in target or "@" in target):
        from veo_edge.builddir import verify

        return {"kind": "build", **verify(target, progress=progress).to_dict()}
    from veo_edge.packaging.imagetrust import verify_image

    try:
        report = verify_image(
            target,
            key,
            signature=signature,
            allow_unsigned=allow_unsigned,
            cache_volume=cache,
            veo_edge_only=True,
        )
    except VeoEdgeError as e:  # --json prints the report on failure too, as a build directory's does
        e.details = {"kind": "image", "target": target, "ok": False, **(e.details or {})}
        raise
    return {"kind": "image", **report}


def verify_command(
    target: str = typer.Argument(
        ..., help="A build directory, an image root directory, or an image in the Docker engine (tag or id)."
    ),
    key: str = typer.Option(
        None,
        "--key",
        help="Images: the trusted signing key, sha256:... fingerprint or PEM public key (or $VEO_EDGE_TRUSTED_KEY).",
    ),
    signature: Path = typer.Option(
        None,
        "--signature",
        help="Images: a detached signature file (default: the <repo>:sha256-<id>.sig image on the engine).",
    ),
    allow_unsigned: bool = typer.Option(
        False,
        "--allow-unsigned",
        help="Images: report an unsigned, unpinned or wrongly signed image loudly instead of refusing it.",
    ),
    cache: str = typer.Option(
        None,
        "--cache",
        help="Also check the cache volume for planted files: a directory (image root) or a volume (IMAGE).",
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

    An image: its ID (the digest of its config: entrypoint, environment, user, labels, every layer)
    against the signature beside it, by the trusted key (--key, else $VEO_EDGE_TRUSTED_KEY, else the
    local key `veo-edge build` made here); then every file baked under /opt/veo-edge against the
    in-image manifest. Unsigned images, other keys and changed images are refused.

    Exit codes: 0 intact; 30 an artifact differs from the manifest (the line names the file and both
    hashes); 31 the manifest does not follow its schema; 7 not a build directory or an artifact is missing;
    43 an image's files or signature do not match; 49 no such image in the engine; 41 no Docker engine
    for an image.
    """
    report = verify_target(
        target,
        progress=False if (quiet or json_out) else progress,
        key=key,
        signature=signature,
        allow_unsigned=allow_unsigned,
        cache=cache,
    )
    for warning in report.get("warnings") or []:
        console(stderr=True).print(f"[bold red]WARNING (--allow-unsigned):[/] {warning}", soft_wrap=True)
    if json_out:
        print_json(report)
        return
    if quiet:
        return
    c = console()
    if report["kind"] == "image":
        # its files match; --allow-unsigned accepted an image ID no trusted key signed: not "verified"
        accepted = report.get("image_id") and not report.get("verified")
        if not report.get("image_id"):
            signed = f"signed by {report['signed_by']}" if report["signed_by"] else "UNSIGNED (allowed)"
        elif accepted:
            signed = "its image ID is not signed by a trusted key"
        else:
            signed = f"image ID signed by {report['signed_by']} (trusted: {report['pinned_from']}"
            tried = report.get("signatures") or []
            signed += f"; {report['signature']} of {len(tried)} found)" if len(tried) > 1 else ")"
        head = "[bold yellow]accepted UNVERIFIED[/]" if accepted else "[bold green]verified[/]"
        cache_note = f"; cache clean ({report['cache']['entries']} entries)" if report.get("cache") else ""
        c.print(
            f"{head} {report['source']}{' (--allow-unsigned)' if accepted else ''}: {report['files']} files, "
            f"{report['bytes'] / 1e6:.1f} MB, every sha256 matches the image manifest; {signed}{cache_note}",
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

"""``veo-edge image build``: the container image of a build (also ``veo-edge build --target``). Images
are verified by ``veo-edge verify IMAGE`` (cli/verify.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from veo_edge.cli._common import console, print_json

app = typer.Typer(
    help="Container images of a build (verify them with `veo-edge verify IMAGE`).", no_args_is_help=True
)


def package(
    build_dir: Path,
    target: str,
    image: str | None = None,
    save: Path | None = None,
    context_only: bool = False,
    base_image: str | None = None,
    sign_key: Path | None = None,
    out: Path | None = None,
    force: bool = False,
    quiet: bool = False,
    platform: str | None = None,
    plugin_libs: bool = True,
) -> dict:
    """Assemble the context for ``target`` next to ``build_dir`` and, unless ``context_only``, build the
    image; prints progress and a summary, returns what was made."""
    from veo_edge.errors import UsageError
    from veo_edge.packaging import platforms
    from veo_edge.packaging.context import ContextOptions, assemble_context, check_build_dir
    from veo_edge.targets import get_target

    if context_only and (image or save):
        raise UsageError("--context-only stops before the engine; it cannot be combined with --image/--save")
    c = console()

    def say(msg: str) -> None:
        if not quiet:
            c.print(msg, style="dim", soft_wrap=True, markup=False, highlight=False)

    check_build_dir(build_dir)
    if sign_key is not None:  # a missing, public or other key: a usage error before any work
        from veo_edge.errors import PackagingError
        from veo_edge.packaging import signing

        if not Path(sign_key).is_file():
            raise UsageError(f"--sign-key {sign_key} is not a file; pass an Ed25519 PEM private key")
        try:
            signing.load_private_key(sign_key)
        except PackagingError as e:
            raise UsageError(str(e)) from e
    t = get_target(target)
    platform = platform or t.platform
    client = base_id = None
    if not context_only:
        from veo_edge.packaging.image import connect, ensure_base

        client = connect(building=True)  # before minutes of assembly: no engine is a one-line error now
        # a base the engine lacks and cannot pull: one line now, not after the context and a failed FROM
        base_id = ensure_base(client, base_image or t.base_image, platform, say)
    # the platform's target, with the Python and glibc of its base image (read from the image when an
    # engine holds it; the target's declared values otherwise, and the progress says which)
    facts = platforms.base_facts(t, base_image or t.base_image, platform, client, say)
    ctx = assemble_context(
        ContextOptions(
            build_dir=build_dir, target=platforms.for_platform(t, platform, facts), out=out,
            base_image=base_image, force=force, plugin_libs=plugin_libs, base_image_id=base_id,
        ),
        progress=say,
    )  # fmt: skip
    result = {"context": str(ctx.path), "target": target, "build_args": ctx.build_args}
    if context_only:
        if not quiet:
            import shlex

            args = " ".join(f"--build-arg {k}={shlex.quote(str(v))}" for k, v in ctx.build_args.items())
            c.print(f"[bold green]Image context[/] for {target} -> {ctx.path}")
            c.print(  # its build args are part of the image (base, labels): without them it is another one
                f"  to build it yourself (unsigned; `veo-edge image build` builds and signs it): docker build "
                f"--target {ctx.stage} {args} {shlex.quote(str(ctx.path))}",
                markup=False,
                soft_wrap=True,
            )
        return result
    from veo_edge.packaging.image import build_image

    if sign_key is None:  # the default path signs: the local key, made once, as ssh-keygen makes one
        from veo_edge.packaging import localkey

        sign_key, fp, created = localkey.ensure()
        err = console(stderr=True)
        if created:
            err.print(
                f"Created the local image signing key {sign_key} (public: {localkey.public_path()}).\n"
                f"The key fingerprint is: {fp} (ED25519). `veo-edge deploy` from this machine trusts it; "
                f"elsewhere pin it with --verify-key {fp}",
                soft_wrap=True,
                markup=False,
                highlight=False,
            )
        elif not quiet:
            say(f"image: signing with the local key {sign_key} ({fp})")
    try:
        built = build_image(ctx, tag=image, sign_key=sign_key, progress=say, client=client)
    except BaseException:  # a failed or interrupted build leaves no context behind (and no stage image)
        _remove_context(ctx.path)
        raise
    if save is not None:  # the image is made: a failed save keeps it and its context
        from veo_edge.packaging.engineimages import save_image

        built.saved = save_image(client, built.tag, Path(save), say, built.signature_tag)
    result.update(
        image=built.tag,
        id=built.id,
        size_bytes=built.size,
        saved=str(built.saved) if built.saved else None,
        signed_by=built.manifest.get("signing_key"),
        signature_image=built.signature_tag,
        signature_file=str(built.signature_file) if built.signature_file else None,
        files=len(built.manifest["files"]),
    )
    if not quiet:
        c.print(
            f"[bold green]Image[/] {built.tag} ({built.size / 1e6:.0f} MB, {len(built.manifest['files'])} files in "
            f"the manifest, {'signed by ' + built.manifest['signing_key'] if 'signing_key' in built.manifest else 'unsigned'})"
        )
        if built.signature_tag:
            c.print(f"  signature of image ID {built.id}: {built.signature_tag} and {built.signature_file}")
        if built.saved:
            with_sig = f" with its signature image {built.signature_tag}" if built.signature_tag else ""
            c.print(
                f"  saved to {built.saved}{with_sig} (docker load -i {built.saved}, then veo-edge verify "
                f"{built.tag})",
                markup=False,
                soft_wrap=True,
            )
        c.print(f"  context, SBOM and manifest: {ctx.path}")
    return result


def _remove_context(path: Path) -> None:
    import shutil

    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    shutil.rmtree(path, ignore_errors=True)
    console(stderr=True).print(
        f"removed the image context {path} ({size / 1e6:.0f} MB): the image was not made",
        markup=False,
        soft_wrap=True,
        highlight=False,
    )


@app.command("build")
def build_command(
    build_dir: Path = typer.Argument(..., help="A build directory made by `veo-edge build`."),
    target: str = typer.Option(..., "--target", "-t", help="orin, a100 or cpu."),
    image: str = typer.Option(None, "--image", help="Image tag (default: veo-edge/MODEL:VERSION-TARGET)."),
    save: Path = typer.Option(
        None, "--save", help="Also write the image and its signature image to this file (docker save)."
    ),
    context_only: bool = typer.Option(False, "--context-only", help="Assemble the build context only."),
    base_image: str = typer.Option(None, "--base-image", help="Runtime base image (default: the target's)."),
    sign_key: Path = typer.Option(
        None,
        "--sign-key",
        help="Ed25519 PEM private key signing the image (default: the local key, made on first use).",
    ),
    out: Path = typer.Option(
        None, "--context-dir", help="Where the context goes (default: BUILD.image-TARGET)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing context directory."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    json_out: bool = typer.Option(False, "--json", help="Print what was made as JSON."),
    platform: str = typer.Option(
        None, "--platform", help="linux/amd64 or linux/arm64 (default: the target's; cpu takes both)."
    ),
    plugin_libs: bool = typer.Option(
        True,
        "--plugin-libs/--no-plugin-libs",
        help="GPU targets: leave the plugin libraries out (CPU path only).",
    ),
) -> None:
    """Build the container image of an existing build directory for a target."""
    from veo_edge.cli._common import interrupt_on_signals
    from veo_edge.packaging.image import check_image_flags

    check_image_flags(image, base_image)  # a name Docker refuses: now, not after the context and image
    with interrupt_on_signals():  # SIGTERM/SIGHUP clean up as Ctrl-C does: no context, no stage image left
        result = package(
            build_dir, target, image, save, context_only, base_image, sign_key, out, force,
            quiet or json_out, platform, plugin_libs,
        )  # fmt: skip
    if json_out:
        print_json(result)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="image")

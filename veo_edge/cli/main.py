"""The ``veo-edge`` command: assembles the command groups, turns errors into one line and an exit code."""

from __future__ import annotations

import json
import sys

import typer

from veo_edge import __version__
from veo_edge.cli import (
    build,
    deploy,
    doctor,
    engine,
    healthcheck,
    image,
    infer,
    inspect,
    serve,
    soak,
    verify,
)
from veo_edge.cli._common import State, console, interrupted_by, print_json

app = typer.Typer(
    name="veo-edge",
    help="Vision Transformers from PyTorch to a monitored TensorRT / OpenVINO inference service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"veo-edge {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks (also VEO_EDGE_DEBUG=1)."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    if debug:
        State.debug = True


build.register(app)
infer.register(app)
engine.register(app)
doctor.register(app)
serve.register(app)
healthcheck.register(app)
inspect.register(app)
deploy.register(app)
soak.register(app)
verify.register(app)
image.register(app)


def _interrupt_behind(e: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt an exit was raised for, if any (typer chains it: exit 130 from it)."""
    seen = e
    for _ in range(4):
        seen = seen.__cause__ or seen.__context__
        if seen is None or isinstance(seen, KeyboardInterrupt):
            return seen
    return None


def _say_interrupted(e: KeyboardInterrupt) -> None:
    """``interrupted``, and by which signal where :func:`interrupt_on_signals` raised it (Ctrl-C: none)."""
    by = f" by {e.args[0]}" if e.args and str(e.args[0]).startswith("SIG") else ""
    console(stderr=True).print(f"[yellow]interrupted{by}[/]")


def main(argv: list[str] | None = None) -> None:
    from veo_edge.errors import INTERNAL_ERROR, VeoEdgeError, one_line
    from veo_edge.privacy import keep_telemetry_off

    keep_telemetry_off()  # before any command imports OpenVINO, NNCF or ONNX Runtime (veo_edge/privacy.py)

    args = sys.argv[1:] if argv is None else list(argv)
    try:
        app(args=args, prog_name="veo-edge")
    except VeoEdgeError as e:
        if State.debug:
            if e.details:
                sys.stderr.write(json.dumps(e.details, indent=2, default=str) + "\n")
            raise
        line = one_line(e)
        if e.details and "--json" in args:  # the specifics, machine-readable, where the command's JSON goes
            print_json({"error": line, "exit_code": e.exit_code, **e.details})
        from rich.markup import escape

        console(stderr=True).print(f"[bold red]error:[/] {escape(line)}", soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP where a command turns them into it
        _say_interrupted(e)
        sys.exit(130)
    except SystemExit as e:  # typer turns KeyboardInterrupt into a silent exit 130: say why
        interrupt = _interrupt_behind(e)
        if interrupt is not None:
            _say_interrupted(interrupt)
        raise
    except Exception as e:
        if State.debug:
            raise
        signame = interrupted_by()
        if signame:  # the interrupt raised inside an import, and came out as another error
            _say_interrupted(KeyboardInterrupt(signame))
            sys.exit(130)
        from rich.markup import escape

        line = one_line(e)
        console(stderr=True).print(
            f"[bold red]internal error:[/] {type(e).__name__}: {escape(line)} (run with --debug for the traceback)",
            soft_wrap=True,
        )
        sys.exit(INTERNAL_ERROR)


if __name__ == "__main__":
    main()

"""``veo-edge healthcheck``: live, ready and a golden canary inference; one line and an exit code."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from veo_edge.cli._common import print_json
from veo_edge.serve.probe import DEFAULT_URL, healthy_line


def healthcheck(
    url: str = typer.Option(None, "--url", help=f"Server to check (default {DEFAULT_URL})."),
    build_dir: Path = typer.Option(
        None,
        "--build-dir",
        help="Golden canary source; with --url, the build the server serves (another is refused). Alone "
        "(without --url): local mode, no server, runs the canary in-process.",
    ),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds for the whole check; it never hangs."),
    model_name: str = typer.Option(None, "--model-name", help="Model to check (default: the served one)."),
    token_file: Path = typer.Option(
        None,
        "--token-file",
        envvar="VEO_EDGE_CONTROL_TOKEN_FILE",
        help="The server's bearer token, for a server run with --restrict-api health, metadata or "
        "inference (or $VEO_EDGE_CONTROL_TOKEN).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON when healthy."),
) -> None:
    """Check a server (or, with only --build-dir, a build) and exit 0 when healthy.

    Exit codes: 0 healthy; 20 server down (nothing answers, not live); 21 not ready (no backend,
    failed start canary, unknown model); 22 canary mismatch (inference failed, output off the golden
    one, golden file unreadable, --build-dir not the served build); 23 timeout; 24 unauthorized (the server wants its token: --token-file);
    30 the build (--build-dir) was modified after it was built (an artifact's sha256 differs from its
    manifest); 31 its manifest.json does not follow its schema; 7 the golden build directory
    (--build-dir, or with --url $VEO_EDGE_BUILD_DIR; the error names which) is no build directory
    (missing, or without a manifest); 2 usage. The reason is printed on one line. A canary answer off
    the served rule is asked for again, up to 3 times, before it is a mismatch (a transient fault's
    retry may have run on a standby of another precision).
    """
    from veo_edge.errors import UsageError
    from veo_edge.serve.control import load_token
    from veo_edge.serve.health import check_local, check_server

    if timeout <= 0:
        raise UsageError(f"--timeout {timeout} must be positive")
    if build_dir is not None and url is None:
        report = check_local(str(build_dir), timeout=timeout)
    else:
        golden = str(build_dir) if build_dir else os.environ.get("VEO_EDGE_BUILD_DIR") or None
        source = "--build-dir" if build_dir else "VEO_EDGE_BUILD_DIR"  # what its errors name
        token = load_token(token_file)
        report = check_server(url or DEFAULT_URL, golden, model_name, timeout, token, build_dir_from=source)
    if json_out:
        print_json(report)
    else:
        typer.echo(healthy_line(report))


def register(app: typer.Typer) -> None:
    app.command("healthcheck")(healthcheck)

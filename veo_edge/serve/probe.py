"""The image's HEALTHCHECK probe: ``python -m veo_edge.serve.probe``, the server check of ``veo-edge
healthcheck --url`` started without the command line's framework.

Docker starts the probe again every interval for the life of each container, so its start-up is paid over
and over on the device. Through ``veo-edge healthcheck`` it imported typer, rich and pydantic first: 0.7-0.8
s of CPU per probe on a 2-core x86 host, where this entry takes ~0.4 s (the check itself and numpy). The
options, the output line and the exit codes are those of ``veo-edge healthcheck`` in server mode (the golden
canary from ``VEO_EDGE_BUILD_DIR`` when set, else the server's own); ``healthcheck/healthcheck.sh`` runs it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"


def healthy_line(report: dict[str, Any]) -> str:
    """The one line a healthy check prints (the probe and ``veo-edge healthcheck`` alike)."""
    where = report.get("url") or report.get("build_dir")
    c = report["canary"]
    note = f"; {report['note']}" if report.get("note") else ""
    return (
        f"healthy: {where} (canary max abs {c['max_abs']:.3g} <= {c['atol']:.3g}, cosine {c['cosine']:.6f}"
        f"{note})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m veo_edge.serve.probe",
        description="Check a veo-edge server (live, ready, a golden canary inference); exit 0 when healthy. "
        "Exit codes as `veo-edge healthcheck`: 20 down, 21 not ready, 22 canary mismatch, 23 timeout, "
        "24 unauthorized, 30 build modified, 2 usage. A server token (VEO_EDGE_CONTROL_TOKEN_FILE or "
        "VEO_EDGE_CONTROL_TOKEN, the server's own environment in its container) is sent as the bearer "
        "token a --restrict-api server asks for.",
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"server to check (default {DEFAULT_URL})")
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds for the whole check (default 10)"
    )
    parser.add_argument("--model-name", help="model to check (default: the served one)")
    args = parser.parse_args(argv)  # a bad option: usage and exit 2, as the command line
    if not args.timeout > 0:
        print(f"error: --timeout {args.timeout} must be positive", file=sys.stderr)
        return 2

    from pathlib import Path

    from veo_edge.errors import INTERNAL_ERROR, VeoEdgeError, one_line
    from veo_edge.serve.control import TOKEN_FILE_ENV, load_token
    from veo_edge.serve.health import check_server

    golden = os.environ.get("VEO_EDGE_BUILD_DIR") or None
    try:
        token_file = os.environ.get(TOKEN_FILE_ENV)
        token = load_token(Path(token_file) if token_file else None)
        report = check_server(
            args.url, golden, args.model_name, args.timeout, token, build_dir_from="VEO_EDGE_BUILD_DIR"
        )
    except VeoEdgeError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # a bug in veo-edge: one line, as the command line says it
        print(f"internal error: {type(e).__name__}: {one_line(e)}", file=sys.stderr)
        return INTERNAL_ERROR
    print(healthy_line(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

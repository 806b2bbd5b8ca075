"""What every command shares: the console, the debug switch, and one-line JSON output."""

from __future__ import annotations

import json
import os
import sys
from typing import Any


class State:
    debug: bool = os.environ.get("VEO_EDGE_DEBUG", "") not in ("", "0")


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")

"""OpenVINO's usage telemetry stays off in veo-edge's own processes unless the user opted in to it.

OpenVINO collects anonymous usage data by default and sends it to Google Analytics until the user runs
``opt_in_out --opt_out`` (docs.openvino.ai, "OpenVINO Telemetry"): ``import openvino`` sends an event, each
model conversion ~30 more (counted by their lookups of www.google-analytics.com), NNCF's quantization its
own, and the first one writes a client id to ``~/intel/openvino_ga_cid``. veo-edge runs on build hosts and
on fleet devices, where a call home that nobody asked for is unwelcome, and it costs: converting vit-tiny's
ONNX took 3.9 s of CPU and 2.2 s of wall time in a process with it, 1.0 s and 0.8 s without (on a 2-core x86
host with no route to it; median of 8).

So veo-edge's own entry points (the ``veo-edge`` command, which the images' server runs) block the import of
``openvino_telemetry`` before anything imports OpenVINO: OpenVINO's converter and NNCF then take the path
they have for an absent telemetry package, which sends nothing; the children it starts to test an import
(:mod:`veo_edge.runtime.imports`) import the same way (:func:`child_prelude`). A user who opted in (``opt_in_out
--opt_in`` wrote 1 to ``~/intel/openvino_telemetry``) keeps it on. Importing veo_edge as a library changes
nothing in the importing process.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: what ``opt_in_out`` writes: 1 opted in, 0 opted out
CONSENT_FILE = ("intel", "openvino_telemetry")


def opted_in() -> bool:
    """Whether the user opted in to OpenVINO's telemetry with ``opt_in_out --opt_in``."""
    try:
        return Path.home().joinpath(*CONSENT_FILE).read_text().strip() == "1"
    except (OSError, RuntimeError):  # no such file, or no home directory to look in
        return False


def keep_openvino_telemetry_off() -> None:
    """Block ``openvino_telemetry``'s import in this process unless the user opted in. Call it before
    OpenVINO or NNCF is imported; once ``openvino_telemetry`` is imported it changes nothing."""
    if "openvino_telemetry" not in sys.modules and not opted_in():
        sys.modules["openvino_telemetry"] = None  # `import openvino_telemetry` now raises ImportError


def child_prelude() -> str:
    """The statement a ``python -c`` child of this process runs first to import as this process does
    (:mod:`veo_edge.runtime.imports`' checks): the block, where this process has it; else nothing."""
    blocked = "openvino_telemetry" in sys.modules and sys.modules["openvino_telemetry"] is None
    return "import sys; sys.modules['openvino_telemetry'] = None; " if blocked else ""


def openvino_telemetry_state() -> str:
    """What this process does with OpenVINO's telemetry, in words (``veo-edge doctor``)."""
    if child_prelude():
        return "usage telemetry off (veo-edge's default; opt_in_out --opt_in turns it on)"
    if opted_in():
        return "usage telemetry on: you opted in (opt_in_out --opt_out turns it off)"
    return "usage telemetry on: OpenVINO's default outside veo-edge's command (opt_in_out --opt_out turns it off)"

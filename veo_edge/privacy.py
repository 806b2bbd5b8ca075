"""OpenVINO's and ONNX Runtime's usage telemetry stay off in veo-edge's own processes unless the user opted
in to them.

OpenVINO collects anonymous usage data by default and sends it to Google Analytics until the user runs
``opt_in_out --opt_out`` (docs.openvino.ai, "OpenVINO Telemetry"): ``import openvino`` sends an event, each
model conversion ~30 more (counted by their lookups of www.google-analytics.com), NNCF's quantization its
own, and the first one writes a client id to ``~/intel/openvino_ga_cid``. ONNX Runtime (1.29 and later, on
Linux too) sends its own events to Microsoft's 1DS collector (mobile.events.data.microsoft.com: a test of
this module's saw a ``veo-edge doctor`` ask for it) until ``ORT_DISABLE_TELEMETRY=1`` is set before it
initialises. veo-edge runs on build hosts and on fleet devices, where a call home that nobody asked for is
unwelcome, and it costs: converting vit-tiny's ONNX took 3.9 s of CPU and 2.2 s of wall time in a process
with OpenVINO's, 1.0 s and 0.8 s without (on a 2-core x86 host with no route to it; median of 8).

So veo-edge's own entry points (the ``veo-edge`` command, which the images' server runs) turn both off
before anything imports either: they block the import of ``openvino_telemetry`` (OpenVINO's converter and
NNCF then take the path they have for an absent telemetry package, which sends nothing) and set
``ORT_DISABLE_TELEMETRY=1``, which the processes they start inherit; the children that test an import
(:mod:`veo_edge.runtime.imports`) block OpenVINO's the same way (:func:`child_prelude`). A user who opted
in keeps it on: ``opt_in_out --opt_in`` wrote 1 to ``~/intel/openvino_telemetry``, or
``ORT_DISABLE_TELEMETRY`` is set already (to 0, say). Importing veo_edge as a library changes nothing in
the importing process.
"""

from __future__ import annotations

import os
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


#: ONNX Runtime's switch: 1 sends nothing (read once, when it initialises)
ORT_SWITCH = "ORT_DISABLE_TELEMETRY"


def keep_telemetry_off() -> None:
    """Block ``openvino_telemetry``'s import in this process unless the user opted in, and set
    ``ORT_DISABLE_TELEMETRY=1`` unless it is set. Call it before OpenVINO, NNCF or ONNX Runtime is
    imported; once they are, it changes nothing for them."""
    if "openvino_telemetry" not in sys.modules and not opted_in():
        sys.modules["openvino_telemetry"] = None  # `import openvino_telemetry` now raises ImportError
    os.environ.setdefault(ORT_SWITCH, "1")


def _openvino_blocked() -> bool:
    return "openvino_telemetry" in sys.modules and sys.modules["openvino_telemetry"] is None


def child_prelude() -> str:
    """The statement a ``python -c`` child of this process runs first to import as this process does
    (:mod:`veo_edge.runtime.imports`' checks): the block, where this process has it; else nothing."""
    return "import sys; sys.modules['openvino_telemetry'] = None; " if _openvino_blocked() else ""


def openvino_telemetry_state() -> str:
    """What this process does with OpenVINO's telemetry, in words (``veo-edge doctor``)."""
    if _openvino_blocked():
        return "usage telemetry off (veo-edge's default; opt_in_out --opt_in turns it on)"
    if opted_in():
        return "usage telemetry on: you opted in (opt_in_out --opt_out turns it off)"
    return "usage telemetry on: OpenVINO's default outside veo-edge's command (opt_in_out --opt_out turns it off)"


def onnxruntime_telemetry_state() -> str:
    """What this process does with ONNX Runtime's telemetry, in words (``veo-edge doctor``)."""
    value = os.environ.get(ORT_SWITCH)
    if value == "1":
        return f"usage telemetry off ({ORT_SWITCH}=1, veo-edge's default)"
    if value is None:
        return f"usage telemetry on: ONNX Runtime's default outside veo-edge's command ({ORT_SWITCH}=1 turns it off)"
    return f"usage telemetry on: {ORT_SWITCH}={value} was set"

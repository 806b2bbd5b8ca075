"""The int8 quantization step's import of NNCF leaves the process's logging as it was: NNCF's logger
module calls ``logging.setLoggerClass`` at import. Each check runs in a fresh interpreter, where NNCF
has not been imported yet."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _logger_class_after(code: str) -> str:
    prog = f"import logging\nbefore = logging.getLoggerClass()\n{code}\nprint(logging.getLoggerClass() is before)"
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def test_importing_the_quantize_module_and_nncf_keeps_the_logger_class():
    pytest.importorskip("nncf")
    # the side effect this guards against is real: a bare import replaces the class
    assert _logger_class_after("import nncf") == "False"
    code = "from veo_edge.export import quantize\nassert quantize.import_nncf().quantize"
    assert _logger_class_after(code) == "True"

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


def test_a_quantization_leaves_the_levels_of_nncfs_logger_and_its_handlers_as_they_were(nano_build, tmp_path):
    """nncf.set_log_level sets the level of every handler NNCF's logger holds, a host's too (under pytest
    the capture handlers, which then dropped every warning of the process); the quiet run sets the
    logger's own level, for the run only."""
    import logging

    import numpy as np

    from veo_edge.export.quantize import Int8Quantize

    nncf_log = logging.getLogger("nncf")
    host = logging.Handler(logging.INFO)
    nncf_log.addHandler(host)
    before = nncf_log.level
    try:
        x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
        Int8Quantize(x, quiet=True)(nano_build / "openvino" / "model.xml", tmp_path / "model.int8.xml")
    finally:
        nncf_log.removeHandler(host)
    assert host.level == logging.INFO and nncf_log.level == before
    assert (tmp_path / "model.int8.xml").is_file()

"""The test suite's own parallelism holds what it promises (tests/conftest.py): under ``--dist loadgroup``
the tests of one xdist group run on one worker. pytest-xdist names a group by rewriting the item's node
id, which pytest 9 no longer reads, and then every group is silently spread over the workers: the
session's Docker engines and builds would be made once per worker, and the fleet lock would be held by
several at once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(
        "import pytest\n"
        "pytestmark = pytest.mark.xdist_group('one')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_x(i):\n    pass\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup",
         str(tmp_path / "test_grouped.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:]
    workers = set(re.findall(r"\[(gw\d+)\].*PASSED", r.stdout))
    assert len(workers) == 1, workers

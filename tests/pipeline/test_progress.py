"""The build's stage display as a pipe or a log file sees it: one line per stage, no spinner frames."""

from __future__ import annotations

import pytest

from veo_edge.pipeline.progress import StageReporter


def test_a_failed_stage_ends_like_a_finished_one_without_a_spinner_frame(capsys) -> None:
    with StageReporter() as stages:
        with stages.stage("export", "Exporting to ONNX"):
            pass
        with pytest.raises(ValueError), stages.stage("load", "Loading the model"):
            raise ValueError("no such model")
    err = capsys.readouterr().err
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    assert lines[-2].startswith("✓ Exporting to ONNX") and lines[-1].startswith("✗ Loading the model")
    assert not any(0x2800 <= ord(ch) <= 0x28FF for ch in err), err  # braille: the spinner's frames
    assert list(stages.timings) == ["export"]  # only what finished is timed

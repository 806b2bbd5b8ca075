"""Hugging Face test data made once a session: the build of the trained digits checkpoint
(``tests/data/hf-vit-digits``, made by ``tests/support/train_hf_digits.py``) and of a tiny VideoMAE, and
pictures of the digits test split as files.

Test modules in several folders share these builds: each declares a session fixture calling
:func:`hf_digits_build` / :func:`hf_video_build`, which build once for the run (every xdist worker's
fixture gets the same directory).
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np

HF_DIGITS = Path(__file__).resolve().parents[1] / "data" / "hf-vit-digits"
#: the pictures' formats the server and infer tests send (all four Pillow formats the docs name)
FORMATS = ("PNG", "JPEG", "WEBP", "BMP")


def _once(tmp_path_factory, name: str, make) -> Path:
    """``make(out)`` once for the whole run, across xdist workers too (``tests/conftest.py``'s ``shared``)."""
    from tests.conftest import shared

    def in_folder(root: Path) -> None:
        root.mkdir(parents=True)
        make(root / name)

    return shared(tmp_path_factory, name, in_folder) / name


def hf_digits_build(tmp_path_factory) -> Path:
    """``veo-edge build --hf tests/data/hf-vit-digits`` (the CLI, as a user runs it; f32, plugins on)."""

    def make(out: Path) -> None:
        cmd = [sys.executable, "-m", "veo_edge.cli.main", "build", "--hf", str(HF_DIGITS), "--out", str(out)]
        done = subprocess.run([*cmd, "--quiet"], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert "Loading weights" not in done.stderr, "transformers drew its progress bar under --quiet"

    return _once(tmp_path_factory, "hf-vit-digits", make)


def hf_video_build(tmp_path_factory) -> Path:
    """A tiny random VideoMAE (2 layers, 32 wide, 4 frames of 32x32) with its processor, built --hf."""

    def make(out: Path) -> None:
        import torch
        import transformers as tf

        from veo_edge.export.hf_source import HuggingFaceSource
        from veo_edge.pipeline.build import BuildOptions, run_build

        labels = {0: "walk", 1: "run", 2: "jump"}
        ckpt = out.parent / "videomae-ckpt"
        torch.manual_seed(0)
        config = tf.VideoMAEConfig(
            image_size=32,
            patch_size=8,
            num_frames=4,
            tubelet_size=2,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            id2label=labels,
            label2id={v: k for k, v in labels.items()},
        )
        tf.VideoMAEForVideoClassification(config).eval().save_pretrained(ckpt)
        proc = tf.VideoMAEImageProcessorPil(size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32})
        proc.save_pretrained(ckpt)
        opts = BuildOptions(
            source=HuggingFaceSource(str(ckpt)), out=out, quiet=True, plugins=False, max_batch=2
        )
        run_build(opts)

    return _once(tmp_path_factory, "hf-videomae", make)


def digit_pictures(n: int, fmt: str = "PNG", size: int | None = None) -> tuple[list[bytes], np.ndarray]:
    """The first ``n`` scans of the digits test split as encoded pictures (``size``: resized to size x size
    first, any size the server must bring back to 32x32) and their true digits."""
    from PIL import Image

    from veo_edge.models import digits

    test = _test_scans()
    out = []
    for scan in test[0][:n]:
        im = Image.fromarray(digits.render(scan))
        if size is not None:
            im = im.resize((size, size), Image.Resampling.NEAREST)
        buf = io.BytesIO()
        im.save(buf, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        out.append(buf.getvalue())
    return out, test[1][:n]


def _test_scans() -> tuple[np.ndarray, np.ndarray]:
    """The digits test split as 8x8 scans (levels 0..16) and labels, in the split's order."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from veo_edge.models import digits

    d = load_digits()
    _, images, _, y = train_test_split(
        d.images, d.target, test_size=digits.TEST_SIZE, stratify=d.target, random_state=digits.SPLIT_SEED
    )
    return images, y

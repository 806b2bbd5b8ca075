"""The Hugging Face processors a build refuses, at build time and in one line: a class whose steps veo-edge
does not reproduce, an option it does not apply, and a processor without a fixed output size. (What it
reproduces is held against transformers in ``tests/preprocess/test_image.py``.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is not installed (hf extra)")

from veo_edge.errors import ModelLoadError  # noqa: E402
from veo_edge.export.hf_source import HuggingFaceSource  # noqa: E402
from veo_edge.models.huggingface import load_preprocess  # noqa: E402

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _saved(proc, path: Path) -> Path:
    proc.save_pretrained(path)
    return path


def _tiny_vit(path: Path, proc) -> Path:
    import torch

    torch.manual_seed(0)
    transformers.ViTForImageClassification(
        transformers.ViTConfig(image_size=32, patch_size=8, num_labels=3, **SMALL)
    ).save_pretrained(path)
    return _saved(proc, path)


def test_a_processor_class_veo_edge_does_not_reproduce_is_refused(tmp_path) -> None:
    from transformers.models.efficientnet.image_processing_pil_efficientnet import (
        EfficientNetImageProcessorPil,
    )

    path = _saved(EfficientNetImageProcessorPil(size={"height": 32, "width": 32}), tmp_path)
    with pytest.raises(
        ModelLoadError,
        match=r"its image processor EfficientNetImageProcessor preprocesses pictures in a way veo-edge does "
        r"not reproduce; build with --no-preprocess .*ViTImageProcessor",
    ):
        load_preprocess(path, "image")


@pytest.mark.parametrize(
    "proc, option",
    [
        (lambda: transformers.ViTImageProcessorPil(size=32, do_pad=True, pad_size=40), "do_pad=True"),
        (lambda: transformers.ViTImageProcessorPil(size=32, data_format="channels_last"), "data_format="),
    ],
    ids=["pad", "channels-last"],
)
def test_an_option_veo_edge_does_not_apply_is_refused_by_name(tmp_path, proc, option) -> None:
    with pytest.raises(ModelLoadError, match=rf"its ViTImageProcessor sets {option}.* --no-preprocess"):
        load_preprocess(_saved(proc(), tmp_path), "image")


def test_a_resize_veo_edge_does_not_make_is_refused(tmp_path) -> None:
    """Shortest edge capped by a longest edge: transformers keeps the aspect ratio within both."""
    proc = transformers.ViTImageProcessorPil(size={"shortest_edge": 32, "longest_edge": 40})
    with pytest.raises(
        ModelLoadError,
        match=r"its ViTImageProcessor's preprocessing size \{'longest_edge': 40, 'shortest_edge': 32\} is not "
        r"supported; .* --no-preprocess",
    ):
        load_preprocess(_saved(proc, tmp_path), "image")


def test_convnext_cropping_twice_is_refused(tmp_path) -> None:
    proc = transformers.ConvNextImageProcessorPil(
        size={"shortest_edge": 64}, crop_pct=0.875, do_center_crop=True, crop_size=48
    )
    with pytest.raises(ModelLoadError, match=r"ConvNextImageProcessor crops twice \(crop_pct 0.875"):
        load_preprocess(_saved(proc, tmp_path), "image")


def test_a_resize_without_a_fixed_size_is_refused_at_build_time(tmp_path) -> None:
    """Shortest edge 32, no crop: a 4:3 picture comes out 32x42, which a 32x32 build cannot take. The
    build said nothing and infer failed on the first picture; the build now refuses, exit 3, one line."""
    ckpt = _tiny_vit(tmp_path / "ckpt", transformers.ViTImageProcessorPil(size={"shortest_edge": 32}))
    with pytest.raises(
        ModelLoadError,
        match=r"makes pictures whose size depends on each picture \(RGB: resize shortest edge 32 .*\), but "
        r"the build takes one size, 32x32; set do_center_crop and crop_size",
    ):
        HuggingFaceSource(str(ckpt)).load()
    cmd = [
        sys.executable,
        "-m",
        "veo_edge.cli.main",
        "build",
        "--hf",
        str(ckpt),
        "--out",
        str(tmp_path / "o"),
    ]
    done = subprocess.run([*cmd, "--quiet"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "--no-preprocess" in done.stderr
    assert not (tmp_path / "o").exists()


def test_no_preprocess_builds_without_the_processor_and_says_so(tmp_path) -> None:
    from transformers.models.efficientnet.image_processing_pil_efficientnet import (
        EfficientNetImageProcessorPil,
    )

    ckpt = _tiny_vit(tmp_path / "ckpt", EfficientNetImageProcessorPil(size={"height": 32, "width": 32}))
    with pytest.raises(ModelLoadError, match="EfficientNetImageProcessor"):
        HuggingFaceSource(str(ckpt)).load()
    loaded = HuggingFaceSource(str(ckpt), pictures=False).load()
    assert loaded.preprocess is None and loaded.input_shape == (3, 32, 32)
    assert any("--no-preprocess" in n for n in loaded.notes)


def test_no_preprocess_goes_with_hf(tmp_path) -> None:
    cmd = [sys.executable, "-m", "veo_edge.cli.main", "build", "--model", "vit-nano", "--no-preprocess"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and "--no-preprocess goes with --hf" in done.stderr, done.stderr
    assert not (tmp_path / "vit-nano").exists()

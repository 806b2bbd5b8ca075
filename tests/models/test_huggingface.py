"""``build --hf``: the trained Hugging Face digits checkpoint (``tests/data/hf-vit-digits``) built as a
user builds it and scored on the digits test split against vit-digits; hub ids from the local cache;
what a bare backbone serves; a machine without transformers. The per-family builds (parity, fusion) are
in ``tests/surgery/test_hf_families.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.hf import HF_DIGITS, _test_scans, hf_digits_build

transformers = pytest.importorskip("transformers", reason="transformers is not installed (hf extra)")

from veo_edge.errors import ModelLoadError, UsageError  # noqa: E402
from veo_edge.export.hf_source import HuggingFaceSource  # noqa: E402

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


@pytest.fixture(scope="session")
def hf_digits(tmp_path_factory) -> Path:
    return hf_digits_build(tmp_path_factory)


def test_the_committed_checkpoint_is_small_and_complete() -> None:
    files = {p.name: p.stat().st_size for p in HF_DIGITS.iterdir()}
    assert set(files) == {"config.json", "model.safetensors", "preprocessor_config.json"}
    assert sum(files.values()) < 500_000, files  # float16 weights: 0.42 MB


@pytest.mark.slow
def test_the_trained_digits_checkpoint_builds_to_vit_digits_accuracy(hf_digits: Path) -> None:
    """The build's OpenVINO IR (f32, stated) on the 540 held-out scans, each rendered as a picture and
    preprocessed as the manifest says, against vit-digits' own accuracy on the same split."""
    import torch
    from PIL import Image

    from veo_edge.builddir import BuildDir
    from veo_edge.models import create_model, digits
    from veo_edge.preprocess import Preprocess
    from veo_edge.runtime.loaders import cpu_runner

    build = BuildDir.open(hf_digits)
    m = build.manifest
    assert m["labels"] == [f"digit {d}" for d in range(10)]
    assert m["model"]["config"]["architecture"] == "ViTForImageClassification"
    assert m["input_shape"] == [1, 32, 32] and m["schema_minor"] == 1
    assert (m.get("cpu_precision") or {}).get("served", {}).get("openvino", "f32") == "f32"
    prep = Preprocess.from_manifest(m["preprocess"])
    assert (prep.channel_order, prep.resample, prep.processor) == ("L", 0, "ViTImageProcessor")
    scans, y = _test_scans()
    x = np.stack([prep(Image.fromarray(digits.render(s))) for s in scans])
    with cpu_runner(build, "openvino") as runner:
        logits = np.concatenate([runner.infer(x[i : i + 8])["logits"] for i in range(0, len(x), 8)])
    ours = float((logits.argmax(1) == y).mean())
    test = digits.test_split()
    with torch.no_grad():
        ref = create_model("vit-digits").module(torch.from_numpy(test.x)).argmax(1).numpy()
    theirs = float((ref == test.y).mean())
    print(f"\nbuild --hf hf-vit-digits: {ours:.2%} on {len(y)} held-out pictures; vit-digits {theirs:.2%}")
    assert ours >= theirs - 0.005, (ours, theirs)


def _tiny_vit(path: Path) -> Path:
    import torch

    torch.manual_seed(0)
    transformers.ViTForImageClassification(
        transformers.ViTConfig(image_size=32, patch_size=8, num_labels=3, **SMALL)
    ).save_pretrained(path)
    transformers.ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(path)
    return path


def test_a_hub_id_is_read_from_the_local_cache_and_names_the_build(tmp_path, monkeypatch) -> None:
    """The layout huggingface_hub writes (models--ORG--NAME/refs/main -> snapshots/COMMIT/)."""
    import huggingface_hub.constants as hub

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-vit"
    _tiny_vit(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    loaded = HuggingFaceSource("someone/tiny-vit").load()
    assert loaded.name == "tiny-vit" and loaded.source == "hf:someone/tiny-vit"
    assert loaded.labels == ["LABEL_0", "LABEL_1", "LABEL_2"] and loaded.input_shape == (3, 32, 32)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelLoadError, match=r"someone/other is not in the local Hugging Face cache and HF_HUB"
    ):
        HuggingFaceSource("someone/other").load()


def test_a_backbone_without_a_pooler_serves_its_last_hidden_state_and_says_so(tmp_path) -> None:
    import torch

    from veo_edge.models.huggingface import load

    torch.manual_seed(0)
    config = transformers.VideoMAEConfig(image_size=32, patch_size=8, num_frames=4, tubelet_size=2, **SMALL)
    transformers.VideoMAEModel(config).save_pretrained(tmp_path / "bare")
    transformers.VideoMAEImageProcessorPil(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    ).save_pretrained(tmp_path / "bare")
    hf = load(str(tmp_path / "bare"))
    assert (hf.output, hf.kind, hf.input_shape, hf.labels) == (
        "last_hidden_state",
        "video",
        (4, 3, 32, 32),
        None,
    )
    assert hf.notes == ["VideoMAEModel has no classification head: the build serves its last_hidden_state"]
    with torch.no_grad():
        assert tuple(hf.module(torch.zeros(1, 4, 3, 32, 32)).shape) == (1, 2 * 4 * 4, 32)


def test_without_transformers_the_error_names_the_extra(tmp_path, monkeypatch) -> None:
    ckpt = _tiny_vit(tmp_path / "vit")
    monkeypatch.setitem(sys.modules, "transformers", None)  # what `import transformers` meets when absent
    with pytest.raises(
        UsageError, match=r"--hf needs Hugging Face transformers.*pip install 'veo-edge\[hf\]'"
    ):
        HuggingFaceSource(str(ckpt)).load()

"""vit-digits: a built-in ViT trained on real data (scikit-learn's handwritten digits), and the user's
own weights for every built-in architecture (``--checkpoint``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from veo_edge.errors import ModelLoadError
from veo_edge.export.source import BuiltinSource
from veo_edge.models import create_model, list_models
from veo_edge.models import digits as digits_data
from veo_edge.models.registry import pretrained_weights


def test_the_split_is_fixed_stratified_and_disjoint() -> None:
    train, test = digits_data.split()
    assert (len(train.y), len(test.y)) == (1257, 540)
    assert train.x.shape[1:] == test.x.shape[1:] == (1, 32, 32)
    assert train.x.dtype == np.float32 and float(train.x.min()) == -1.0 and float(train.x.max()) == 1.0
    # stratified: every class holds ~30% of its scans out
    counts = np.bincount(test.y, minlength=10) / np.bincount(np.concatenate([train.y, test.y]), minlength=10)
    assert np.all(np.abs(counts - 0.3) < 0.02)
    # disjoint: no test scan is also a training scan (the data set has no exact duplicates across them)
    train_rows = {row.tobytes() for row in train.x.reshape(len(train.x), -1)}
    assert sum(row.tobytes() in train_rows for row in test.x.reshape(len(test.x), -1)) == 0
    again = digits_data.split()[1]
    np.testing.assert_array_equal(again.y, test.y)


def test_vit_digits_has_learned_the_digits_on_the_held_out_split() -> None:
    """Accuracy computed here from the shipped weights on the real test split (nothing hard-coded):
    a random model would score ~10%."""
    weights = pretrained_weights("vit-digits")
    assert weights is not None and weights.is_file() and weights.stat().st_size < 4 << 20
    net = create_model("vit-digits").module
    test = digits_data.test_split()
    with torch.no_grad():
        pred = net(torch.from_numpy(test.x)).argmax(1).numpy()
    accuracy = float((pred == test.y).mean())
    untrained = create_model("vit-digits", pretrained=False).module
    with torch.no_grad():
        chance = float((untrained(torch.from_numpy(test.x)).argmax(1).numpy() == test.y).mean())
    print(f"\nvit-digits: top-1 {accuracy:.2%} on the {len(test.y)} held-out scans (untrained: {chance:.2%})")
    assert accuracy >= 0.9, accuracy
    assert chance < 0.3


@pytest.mark.parametrize("name", list_models())
def test_every_builtin_takes_its_own_weights_back(name: str, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    donor = create_model(name, seed=7, pretrained=False).module
    state = {k: v.contiguous() for k, v in donor.state_dict().items()}
    path = tmp_path / "w.safetensors"
    save_file(state, str(path))
    loaded = BuiltinSource(name, checkpoint=path).load()
    for k, v in loaded.module.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert loaded.config["weights"] == "checkpoint:w.safetensors"


def test_a_checkpoint_that_does_not_fit_names_the_keys_and_shapes(tmp_path: Path) -> None:
    state = create_model("vit-nano").module.state_dict()
    state["head.weight"] = torch.zeros(7, 64)  # wrong number of classes
    del state["norm.bias"]
    state["extra.weight"] = torch.zeros(1)
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    with pytest.raises(ModelLoadError) as err:
        BuiltinSource("vit-nano", checkpoint=path).load()
    msg = str(err.value)
    assert "\n" not in msg
    assert "1 missing key(s): norm.bias" in msg
    assert "1 unexpected key(s): extra.weight" in msg
    assert "head.weight is [7, 64] in the checkpoint, [10, 64] in the model" in msg

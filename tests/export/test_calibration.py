"""Calibration and validation data as users hand it over: .npy, .npz, folders of images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from veo_edge.errors import InputError, UsageError
from veo_edge.export.calibration import load_data


def test_npy_and_npz_with_and_without_labels(tmp_path: Path, rng) -> None:
    x = rng.standard_normal((5, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "xy.npz", x=x, y=np.arange(5))
    np.savez(tmp_path / "inputs.npz", inputs=x.astype(np.float64))
    plain = load_data(tmp_path / "x.npy", (1, 8, 8), "--calibration")
    assert not plain.labelled and np.array_equal(plain.x, x)
    labelled = load_data(tmp_path / "xy.npz", (1, 8, 8), "--val")
    assert labelled.labelled and labelled.y.tolist() == [0, 1, 2, 3, 4]
    cast = load_data(tmp_path / "inputs.npz", (1, 8, 8), "--val")
    assert cast.x.dtype == np.float32 and not cast.labelled


def test_bad_data_is_named_with_what_was_expected(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((4, 3, 8, 8), np.float32))
    np.savez(tmp_path / "few.npz", x=np.zeros((4, 1, 8, 8), np.float32), y=np.arange(3))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(
        InputError, match=r"--calibration .*x.npy has inputs of shape \[4, 3, 8, 8\], expected \(N, 1, 8, 8\)"
    ):
        load_data(tmp_path / "x.npy", (1, 8, 8), "--calibration")
    with pytest.raises(InputError, match=r"has 3 labels of dtype int64 for 4 inputs"):
        load_data(tmp_path / "few.npz", (1, 8, 8), "--val")
    with pytest.raises(UsageError, match=r"is a .txt file; expected .npy, .npz or a folder of images"):
        load_data(tmp_path / "notes.txt", (1, 8, 8), "--val")


def test_a_folder_of_class_folders_gives_labelled_images(tmp_path: Path) -> None:
    from PIL import Image

    for label in (0, 1):
        (tmp_path / str(label)).mkdir()
        Image.fromarray(np.full((16, 12), 255 * label, np.uint8)).save(tmp_path / str(label) / "a.png")
    data = load_data(tmp_path, (1, 8, 8), "--val")
    assert data.x.shape == (2, 1, 8, 8) and data.y.tolist() == [0, 1]
    assert data.x[0].max() == -1.0 and data.x[1].min() == 1.0  # 0..255 -> -1..1 for one channel
    with pytest.raises(UsageError, match=r"a folder of images fits image models of 1 or 3 channels"):
        load_data(tmp_path, (3, 4, 8, 8), "--val")


def test_a_folder_of_pictures_is_preprocessed_as_the_build_says(tmp_path: Path) -> None:
    """A build's manifest ``preprocess`` (here vit-digits': nearest to 32x32, p * 2/255 - 1) is how a
    --val/--calibration folder becomes inputs: rendered scans come back as the scans' own inputs."""
    from PIL import Image
    from sklearn.datasets import load_digits

    from veo_edge.models import digits

    d = load_digits()
    for i in range(6):
        folder = tmp_path / str(d.target[i])
        folder.mkdir(exist_ok=True)
        Image.fromarray(digits.render(d.images[i])).save(folder / f"{i}.png")
    data = load_data(tmp_path, (1, 32, 32), "--val", digits.picture_preprocess())
    order = sorted(range(6), key=lambda i: d.target[i])  # class folders in order, one scan each here
    assert data.y.tolist() == [int(d.target[i]) for i in order]
    want = digits.preprocess(d.images[order])
    assert float(np.abs(data.x - want).max()) <= 1 / 255 + 1e-6  # half a grey step of rendering, x 2/255

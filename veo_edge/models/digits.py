"""The real data behind ``vit-digits``: scikit-learn's handwritten digits (UCI ML digits, 1,797 real 8x8
scans of 0-16 grey levels, shipped inside scikit-learn: nothing is downloaded).

One fixed, stratified split: ``train_test_split(test_size=0.3, stratify=y, random_state=0)`` gives 1,257
training and 540 held-out test samples. Each scan is upscaled 4x (nearest neighbour) to 32x32 and mapped
from 0..16 to -1..1: one input is ``(1, 32, 32)`` float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from veo_edge.errors import ModelLoadError

SPLIT_SEED = 0
TEST_SIZE = 0.3
UPSCALE = 4
IMG_SIZE = 8 * UPSCALE
#: how many training samples the int8 build calibrates on by default
CALIBRATION_SIZE = 300
#: the class names the build records (the manifest's ``labels``)
LABELS = [str(d) for d in range(10)]


def picture_preprocess() -> dict:
    """How a picture of a digit becomes an input (the manifest's ``preprocess``): a grey picture with the
    ink bright on black, grey level p in 0..255 standing for the scan's level p * 16 / 255, resized to
    32x32 by nearest neighbour (an 8x8 picture is upscaled exactly as the scans are) and mapped to
    p * 2 / 255 - 1, i.e. -1..1 as :func:`preprocess` maps 0..16."""
    from veo_edge.preprocess import Preprocess

    return Preprocess(
        size={"height": IMG_SIZE, "width": IMG_SIZE},
        resample=0,
        rescale_factor=2 / 255,
        offset=True,
        do_normalize=False,
        channel_order="L",
        processor="vit-digits (8x8 scans, ink bright on black)",
    ).to_manifest()


def render(levels: np.ndarray) -> np.ndarray:
    """One 8x8 scan of levels 0..16 -> the 8x8 uint8 picture :func:`picture_preprocess` reads."""
    return np.rint(np.asarray(levels, np.float64) * 255 / 16).astype(np.uint8)


@dataclass(frozen=True)
class Split:
    x: np.ndarray  # (N, 1, 32, 32) float32
    y: np.ndarray  # (N,) int64


def preprocess(images: np.ndarray) -> np.ndarray:
    """(N, 8, 8) grey levels 0..16 -> (N, 1, 32, 32) float32 in -1..1."""
    up = np.kron(np.asarray(images, dtype=np.float32), np.ones((UPSCALE, UPSCALE), np.float32))
    return (up / 8.0 - 1.0)[:, None].astype(np.float32)


def _raw() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ModelLoadError(
            f"vit-digits needs scikit-learn for its data set ({e}); pip install scikit-learn"
        ) from e
    d = load_digits()
    return d.images, d.target.astype(np.int64)


def split() -> tuple[Split, Split]:
    """(train, test): the fixed stratified split of the 1,797 scans (1,257 / 540)."""
    from sklearn.model_selection import train_test_split

    images, y = _raw()
    tr_x, te_x, tr_y, te_y = train_test_split(
        images, y, test_size=TEST_SIZE, stratify=y, random_state=SPLIT_SEED
    )
    return Split(preprocess(tr_x), tr_y), Split(preprocess(te_x), te_y)


def calibration_set(n: int = CALIBRATION_SIZE) -> np.ndarray:
    """The first ``n`` training inputs (never test samples): the int8 build's default calibration set."""
    return split()[0].x[:n]


def test_split() -> Split:
    return split()[1]


def describe_split() -> str:
    return (
        f"scikit-learn load_digits, train_test_split(test_size={TEST_SIZE}, stratify=y, "
        f"random_state={SPLIT_SEED})"
    )

"""Data for the CPU precision stage: calibration inputs (int8) and validation data (the accuracy guard).

Accepted forms, checked against the model's input shape:
- ``.npy``: inputs ``(N, *input_shape)``, already preprocessed as the model expects;
- ``.npz``: inputs under ``x`` (or ``inputs``), and for validation labels under ``y`` (or ``labels``);
- a folder of images (``.png``/``.jpg``/...): preprocessed as the build's checkpoint says (its manifest
  ``preprocess``, from a Hugging Face processor), or where it says nothing resized bilinearly to the input
  size, scaled to 0..1 and normalised with ImageNet's mean/std (3 channels) or 0.5/0.5 (1 channel); in a
  folder of class folders named ``0``, ``1``, ... each image is labelled by its folder.
Built-in models trained on real data bring their own (``models/digits.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.errors import InputError, UsageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Data:
    x: np.ndarray  # (N, *input_shape) float32
    y: np.ndarray | None  # (N,) int64 labels, or None
    source: str

    @property
    def labelled(self) -> bool:
        return self.y is not None


def load_data(
    path: Path, input_shape: tuple[int, ...], what: str, preprocess: dict[str, Any] | None = None
) -> Data:
    """Inputs (and labels, where the file has some) from ``path``; ``what`` names the flag in errors;
    ``preprocess`` (a manifest ``preprocess`` section) is how a folder's images become inputs."""
    path = Path(path)
    if path.is_dir():
        data = _images(path, input_shape, what, preprocess)
    elif path.suffix == ".npy":
        data = Data(_load_np(path, what), None, str(path))
    elif path.suffix == ".npz":
        data = _npz(path, what)
    elif not path.exists():
        raise UsageError(f"{what} {path} does not exist; expected a .npy/.npz file or a folder of images")
    else:
        raise UsageError(
            f"{what} {path} is a {path.suffix or 'suffix-less'} file; expected .npy, .npz or a folder of images"
        )
    return _checked(data, input_shape, what)


def _load_np(path: Path, what: str):
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(
            f"cannot read {what} {path}: {e}; expected a file written by numpy.save/savez"
        ) from e


def _npz(path: Path, what: str) -> Data:
    arrays = _load_np(path, what)
    keys = list(arrays.keys())
    xk = next((k for k in ("x", "inputs") if k in keys), keys[0] if len(keys) == 1 else None)
    if xk is None:
        raise InputError(f"{what} {path} holds {keys}; expected the inputs under 'x' (and labels under 'y')")
    yk = next((k for k in ("y", "labels") if k in keys), None)
    return Data(arrays[xk], None if yk is None else arrays[yk], str(path))


def _checked(data: Data, input_shape: tuple[int, ...], what: str) -> Data:
    x = np.asarray(data.x)
    if x.ndim == len(input_shape):
        x = x[None]
    if tuple(x.shape[1:]) != tuple(input_shape) or x.shape[0] == 0:
        raise InputError(
            f"{what} {data.source} has inputs of shape {list(x.shape)}, expected (N, {', '.join(map(str, input_shape))}) "
            "with N >= 1, preprocessed as the model expects"
        )
    if not np.issubdtype(x.dtype, np.number):
        raise InputError(f"{what} {data.source} has inputs of dtype {x.dtype}, expected numbers (float32)")
    y = data.y
    if y is not None:
        y = np.asarray(y).reshape(-1)
        if len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
            raise InputError(
                f"{what} {data.source} has {len(y)} labels of dtype {y.dtype} for {len(x)} inputs; "
                "expected one integer class index per input"
            )
        y = y.astype(np.int64)
    return Data(np.ascontiguousarray(x, dtype=np.float32), y, data.source)


def _default_preprocess(input_shape: tuple[int, ...]) -> Any:
    """Where the build says nothing: bilinear to the input size, ImageNet's mean/std (0.5/0.5 for grey)."""
    from veo_edge.preprocess import Preprocess

    chans, h, w = input_shape
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if chans == 3 else ((0.5,), (0.5,))
    return Preprocess(
        size={"height": h, "width": w},
        image_mean=mean,
        image_std=std,
        channel_order="RGB" if chans == 3 else "L",
        processor="veo-edge default (ImageNet mean/std, bilinear)",
    )


def _images(folder: Path, input_shape: tuple[int, ...], what: str, preprocess: dict[str, Any] | None) -> Data:
    if len(input_shape) != 3 or input_shape[0] not in (1, 3):
        raise UsageError(
            f"{what} {folder}: a folder of images fits image models of 1 or 3 channels, this one takes "
            f"{list(input_shape)}; pass a .npy/.npz instead"
        )
    try:
        from PIL import Image
    except ImportError as e:
        raise UsageError(f"{what} {folder}: reading images needs Pillow ({e}); pip install pillow") from e
    from veo_edge.preprocess import Preprocess

    classes = sorted(
        (d for d in folder.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name)
    )
    groups = [(int(d.name), d) for d in classes] if classes else [(None, folder)]
    prep = Preprocess.from_manifest(preprocess) if preprocess else _default_preprocess(input_shape)
    xs, ys = [], []
    for label, d in groups:
        for f in sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
            try:
                with Image.open(f) as im:
                    xs.append(prep(im))
            except OSError as e:
                raise InputError(f"{what}: cannot read image {f}: {e}") from e
            ys.append(label)
    if not xs:
        raise InputError(f"{what} {folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    y = np.array(ys, np.int64) if classes else None
    return Data(np.stack(xs).astype(np.float32), y, str(folder))

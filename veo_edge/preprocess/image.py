"""A checkpoint's image preprocessing, as data (:class:`Preprocess`) and as a function of a PIL image.

The steps and their arithmetic follow Hugging Face's PIL image processors (``backend="pil"``): resize
(to a fixed ``height``/``width``, or the shortest edge to ``shortest_edge`` keeping the aspect ratio,
with the checkpoint's PIL filter), centre crop (zero-padded where the image is smaller), rescale (×
``rescale_factor``, minus 1 where ``offset``, as ViViT does), normalise with the mean/std, channels
first. The tests hold the result against the processor itself on real photographs.

Only numpy and Pillow are needed here: ``infer`` and ``serve`` use this without transformers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from veo_edge.errors import InputError, UsageError

if TYPE_CHECKING:
    from PIL.Image import Image

#: PIL's resampling filters by their numbers (the ones Hugging Face configs store)
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclass(frozen=True)
class Preprocess:
    """What turns one picture (or one video frame) into the model's input, recorded in the manifest."""

    size: dict[str, int]  # {"height", "width"} or {"shortest_edge"}
    resample: int = 2  # a PIL filter number (RESAMPLE_NAMES)
    do_resize: bool = True
    do_center_crop: bool = False
    crop_size: dict[str, int] | None = None  # {"height", "width"}
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    offset: bool = False  # after rescaling, subtract 1 (ViViT: 1/127.5 then -1 gives [-1, 1])
    do_normalize: bool = True
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    channel_order: str = "RGB"  # what the pixels are converted to before the steps ("L": grey)
    num_frames: int | None = None  # video models: frames per clip, evenly spaced over the clip
    processor: str = ""  # the processor class it came from, e.g. ViTImageProcessor
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.do_resize and not (
            {"height", "width"} <= set(self.size) or set(self.size) == {"shortest_edge"}
        ):
            raise UsageError(
                f"preprocessing size {self.size} is not supported; expected height and width, or "
                "shortest_edge alone"
            )
        if self.do_center_crop and not (self.crop_size and {"height", "width"} <= set(self.crop_size)):
            raise UsageError(f"preprocessing crop_size {self.crop_size} needs height and width")
        if self.resample not in RESAMPLE_NAMES:
            raise UsageError(
                f"preprocessing resample {self.resample} is not a PIL filter; expected one of "
                f"{', '.join(f'{k} ({v})' for k, v in RESAMPLE_NAMES.items())}"
            )
        if self.channel_order not in ("RGB", "L"):
            raise UsageError(f"preprocessing channel_order {self.channel_order!r}; expected RGB or L")

    @property
    def channels(self) -> int:
        return 3 if self.channel_order == "RGB" else 1

    @property
    def output_hw(self) -> tuple[int, int] | None:
        """(height, width) of the result, when it does not depend on the picture."""
        if self.do_center_crop and self.crop_size:
            return self.crop_size["height"], self.crop_size["width"]
        if self.do_resize and "height" in self.size:
            return self.size["height"], self.size["width"]
        return None

    def to_manifest(self) -> dict[str, Any]:
        out = asdict(self)
        out["image_mean"] = list(self.image_mean)
        out["image_std"] = list(self.image_std)
        out["resample_name"] = RESAMPLE_NAMES[self.resample]
        if not out["extra"]:
            del out["extra"]
        return out

    @classmethod
    def from_manifest(cls, data: dict[str, Any]) -> Preprocess:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for k in ("image_mean", "image_std"):
            if k in known:
                known[k] = tuple(float(v) for v in known[k])
        return cls(**known)

    def describe(self) -> str:
        """One line for ``inspect``: the steps in order."""
        steps = []
        if self.do_resize:
            how = (
                f"{self.size['height']}x{self.size['width']}"
                if "height" in self.size
                else f"shortest edge {self.size['shortest_edge']}"
            )
            steps.append(f"resize {how} ({RESAMPLE_NAMES[self.resample]})")
        if self.do_center_crop and self.crop_size:
            steps.append(f"centre crop {self.crop_size['height']}x{self.crop_size['width']}")
        if self.do_rescale:
            steps.append(f"rescale x{self.rescale_factor:.6g}" + (" - 1" if self.offset else ""))
        if self.do_normalize:
            mean = ", ".join(f"{v:.4g}" for v in self.image_mean)
            std = ", ".join(f"{v:.4g}" for v in self.image_std)
            steps.append(f"normalise mean ({mean}) std ({std})")
        frames = f"{self.num_frames} frames, " if self.num_frames else ""
        return (
            f"{frames}{self.channel_order}: "
            + ", ".join(steps)
            + (f" [{self.processor}]" if self.processor else "")
        )

    # --- applying it ----------------------------------------------------------------------------

    def __call__(self, image: Image) -> np.ndarray:
        """One picture -> float32 (C, H, W)."""
        from PIL import Image as PILImage

        im = image if image.mode == self.channel_order else _convert(image, self.channel_order)
        if self.do_resize:
            h, w = self._resized_hw(im.height, im.width)
            im = im.resize((w, h), resample=PILImage.Resampling(self.resample))
        a = np.asarray(im)
        a = a[None] if a.ndim == 2 else np.moveaxis(a, -1, 0)
        if self.do_center_crop and self.crop_size:
            a = center_crop(a, self.crop_size["height"], self.crop_size["width"])
        x = a.astype(np.float64) * self.rescale_factor if self.do_rescale else a.astype(np.float64)
        if self.do_rescale and self.offset:
            x = x - 1
        x = x.astype(np.float32)
        if self.do_normalize:
            mean = np.asarray(self.image_mean, np.float32)[:, None, None]
            std = np.asarray(self.image_std, np.float32)[:, None, None]
            x = (x - mean) / std
        return np.ascontiguousarray(x, dtype=np.float32)

    def batch(self, images: list[Image]) -> np.ndarray:
        """Pictures -> float32 (N, C, H, W); every result must have the same size."""
        arrays = [self(im) for im in images]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise InputError(
                f"the pictures preprocess to different shapes {sorted(shapes)}; this preprocessing has no "
                "fixed output size (no crop, shortest-edge resize), so send pictures of one aspect ratio"
            )
        return np.stack(arrays)

    def clip(self, frames: list[Image]) -> np.ndarray:
        """A clip's frames -> float32 (T, C, H, W), ``num_frames`` of them evenly spaced."""
        picked = sample_frames(len(frames), self.num_frames or len(frames))
        return self.batch([frames[i] for i in picked])

    def _resized_hw(self, height: int, width: int) -> tuple[int, int]:
        if "height" in self.size:
            return self.size["height"], self.size["width"]
        size = self.size["shortest_edge"]
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = size, int(size * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)


def _convert(image: Image, mode: str) -> Image:
    """To RGB or L; transparent pixels over white, as Hugging Face's convert_rgb does."""
    from PIL import Image as PILImage

    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = PILImage.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = PILImage.alpha_composite(white, rgba)
    return image.convert(mode)


def center_crop(a: np.ndarray, height: int, width: int) -> np.ndarray:
    """(C, H, W) -> (C, height, width) around the centre, zero-padded where the picture is smaller."""
    _, h, w = a.shape
    if h < height or w < width:
        nh, nw = max(h, height), max(w, width)
        top_pad, left_pad = -(-(nh - h) // 2), -(-(nw - w) // 2)
        padded = np.zeros((a.shape[0], nh, nw), a.dtype)
        padded[:, top_pad : top_pad + h, left_pad : left_pad + w] = a
        top, left = (h - height) // 2 + top_pad, (w - width) // 2 + left_pad
        return padded[:, max(top, 0) : max(top, 0) + height, max(left, 0) : max(left, 0) + width]
    top, left = (h - height) // 2, (w - width) // 2
    return a[:, top : top + height, left : left + width]


def sample_frames(available: int, wanted: int) -> list[int]:
    """``wanted`` frame indices evenly spaced over ``available`` frames (the centre of each of ``wanted``
    equal segments); a clip shorter than ``wanted`` repeats frames. VideoMAE's processor takes the frames
    it is given, so this sampling is ours, and documented."""
    if available < 1:
        raise InputError("the clip has no frames")
    if wanted < 1:
        raise UsageError(f"frames per clip must be at least 1, got {wanted}")
    return [min(available - 1, int((i + 0.5) * available / wanted)) for i in range(wanted)]

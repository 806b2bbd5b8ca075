"""Encoded pictures and clips -> PIL images, with the checks a server needs: a decompression bomb (more
pixels than :data:`MAX_PIXELS`), a truncated file or something that is not a picture is refused with one
line (:class:`InputError`) before it costs memory."""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from veo_edge.errors import InputError, UsageError

if TYPE_CHECKING:
    from PIL.Image import Image

#: the most pixels one picture may have (width x height), checked from its header before decoding:
#: 40 MP is a 7,700 x 5,200 photograph, 120 MB decoded as RGB
MAX_PIXELS = 40_000_000
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm")


def _pil():
    try:
        from PIL import Image
    except ImportError as e:
        raise UsageError(f"pictures need Pillow ({e}); pip install 'veo-edge[images]'") from e
    return Image


def decode_image(data: bytes, what: str = "the picture", max_pixels: int = MAX_PIXELS) -> Image:
    """One encoded picture (JPEG, PNG, WebP, BMP, ...) -> a loaded PIL image."""
    Image = _pil()
    try:
        with warnings.catch_warnings():  # Pillow warns of a bomb on open; the pixel check below refuses it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise InputError(f"{what} is too large to decode: {e}") from e
    except (Image.UnidentifiedImageError, OSError, ValueError) as e:
        kind = _signature(bytes(data[:12]))
        if kind is not None:  # the start of a picture whose header runs past the end: a cut-off file
            raise InputError(
                f"{what} starts as a {kind} but is truncated or corrupt ({len(data)} bytes; Pillow: {e}); "
                "the whole file is needed"
            ) from e
        raise InputError(
            f"{what} is not a picture Pillow can read ({len(data)} bytes starting 0x{bytes(data[:8]).hex()}); expected "
            "JPEG, PNG, WebP or BMP"
        ) from e
    pixels = im.width * im.height
    if pixels > max_pixels:
        raise InputError(
            f"{what} is {im.width}x{im.height} = {pixels:,} pixels, over the limit of {max_pixels:,}; "
            "send a smaller picture"
        )
    try:
        im.load()
    except (OSError, ValueError, SyntaxError) as e:
        raise InputError(f"{what} is truncated or corrupt ({e}); the whole file is needed") from e
    return im


def _signature(head: bytes) -> str | None:
    """The format a file's first bytes announce (JPEG, PNG, WebP, BMP), or None."""
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    if head.startswith(b"BM"):
        return "BMP"
    return None


def read_image(path: Path, max_pixels: int = MAX_PIXELS) -> Image:
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"--image {path} does not exist" if not path.exists() else f"--image {path} is not a file"
        )
    return decode_image(path.read_bytes(), f"--image {path}", max_pixels)


def read_clip(path: Path, max_pixels: int = MAX_PIXELS) -> list[Image]:
    """A clip's frames, all of them, in order: a folder of pictures (sorted by name) or a video file
    (decoded with PyAV, ``pip install 'veo-edge[video]'``)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise InputError(f"--video {path} is a folder without pictures ({', '.join(IMAGE_SUFFIXES)})")
        return [decode_image(f.read_bytes(), f"frame {f}", max_pixels) for f in files]
    if not path.is_file():
        raise InputError(f"--video {path} does not exist")
    try:
        import av
    except ImportError as e:
        raise UsageError(
            f"--video {path}: decoding a video file needs PyAV ({e}); pip install 'veo-edge[video]', or "
            "pass a folder of frames"
        ) from e
    try:
        with av.open(str(path)) as container:
            frames = [f.to_image() for f in container.decode(video=0)]
    except (av.error.FFmpegError, ValueError, IndexError) as e:  # IndexError: no video stream
        raise InputError(f"--video {path} is not a video PyAV can decode: {e}") from e
    if not frames:
        raise InputError(f"--video {path} holds no frames")
    if frames[0].width * frames[0].height > max_pixels:
        raise InputError(f"--video {path}: frames of {frames[0].width}x{frames[0].height} are over the limit")
    return frames

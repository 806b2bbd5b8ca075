"""The project's preprocessing against Hugging Face's PIL image processors (``backend="pil"``, no
torchvision) on real photographs (scikit-learn's two sample images) and on rendered digits, and the
decoder's refusals (bombs, truncated files, non-pictures)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from veo_edge.errors import InputError
from veo_edge.models import digits
from veo_edge.preprocess import Preprocess, sample_frames
from veo_edge.preprocess.decode import decode_image

transformers = pytest.importorskip("transformers", reason="transformers is not installed (dev extra)")

#: the issue's bound, after normalisation
TOL = 1e-4


def _photos() -> list[Image.Image]:
    from sklearn.datasets import load_sample_images

    return [Image.fromarray(a) for a in load_sample_images().images]  # 427x640 RGB photographs


def _digit_pictures() -> list[Image.Image]:
    from sklearn.datasets import load_digits

    scans = load_digits().images[:6]
    return [Image.fromarray(digits.render(s)).convert("RGB").resize((24, 30)) for s in scans]


def _processors():
    from transformers.models.beit.image_processing_pil_beit import BeitImageProcessorPil
    from transformers.models.bit.image_processing_pil_bit import BitImageProcessorPil
    from transformers.models.convnext.image_processing_pil_convnext import ConvNextImageProcessorPil
    from transformers.models.deit.image_processing_pil_deit import DeiTImageProcessorPil
    from transformers.models.videomae.image_processing_pil_videomae import VideoMAEImageProcessorPil

    yield "vit-square", transformers.ViTImageProcessorPil(size={"height": 48, "width": 40})
    yield (
        "deit-crop",
        DeiTImageProcessorPil(size={"height": 57, "width": 61}, crop_size={"height": 48, "width": 48}),
    )
    yield (
        "dinov2-shortest-edge",
        BitImageProcessorPil(size={"shortest_edge": 51}, crop_size={"height": 45, "width": 45}),
    )
    yield (
        "beit",
        BeitImageProcessorPil(
            size={"height": 40, "width": 40}, crop_size={"height": 32, "width": 32}, do_center_crop=True
        ),
    )
    yield (
        "videomae-frame",
        VideoMAEImageProcessorPil(size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32}),
    )
    yield (
        "vivit-offset-frame",  # rescale by 1/127.5, minus 1, then normalise: [-3, 1]
        transformers.VivitImageProcessor(size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32}),
    )
    yield (
        "clip-shortest-edge",  # bicubic, CLIP's mean/std
        transformers.CLIPImageProcessorPil(size={"shortest_edge": 40}, crop_size={"height": 36, "width": 36}),
    )
    yield "siglip", transformers.SiglipImageProcessorPil(size={"height": 36, "width": 44})
    # ConvNeXt below 384: the shortest edge to size / crop_pct, then a centre crop of size x size
    yield "convnext-crop-pct", ConvNextImageProcessorPil(size={"shortest_edge": 64}, crop_pct=0.875)
    yield "convnext-crop-pct-odd", ConvNextImageProcessorPil(size={"shortest_edge": 45}, crop_pct=0.9)
    # ConvNeXt at 384 and above: warped to a square, no crop_pct crop; then the processor's own crop
    yield (
        "convnext-384-warp-then-crop",
        ConvNextImageProcessorPil(
            size={"shortest_edge": 384}, do_center_crop=True, crop_size={"height": 360, "width": 352}
        ),
    )
    # LeViT: the shortest edge to 256/224 of size, then the centre crop
    yield (
        "levit",
        transformers.LevitImageProcessorPil(
            size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}
        ),
    )
    yield (
        "crop-larger-than-picture",
        DeiTImageProcessorPil(size={"height": 20, "width": 20}, crop_size={"height": 24, "width": 26}),
    )


def _ours(proc) -> Preprocess:
    import tempfile
    from pathlib import Path

    from veo_edge.models.huggingface import load_preprocess

    with tempfile.TemporaryDirectory() as d:
        proc.save_pretrained(d)
        kind = "video" if type(proc).__name__.startswith(("VideoMAE", "Vivit")) else "image"
        return load_preprocess(Path(d), kind)


@pytest.mark.parametrize("name, proc", list(_processors()), ids=[n for n, _ in _processors()])
def test_preprocessing_matches_the_hugging_face_pil_processor(name, proc) -> None:
    ours = _ours(proc)
    # the manifest form is what infer and serve use: go through it
    ours = Preprocess.from_manifest(ours.to_manifest())
    for im in _photos() + _digit_pictures():
        if name.endswith("-frame"):  # a video processor: one clip of one frame
            ref = proc([im], return_tensors="np")["pixel_values"][0][0]
        else:
            ref = proc(im, return_tensors="np")["pixel_values"][0]
        got = ours(im)
        assert got.shape == ref.shape, (name, im.size)
        assert got.dtype == np.float32
        err = float(np.abs(got - ref.astype(np.float32)).max())
        assert err <= TOL, (name, im.size, err)


def test_every_processor_veo_edge_reproduces_is_held_against_transformers() -> None:
    from veo_edge.models.hf_processors import REPRODUCED

    tested = {type(p).__name__.removesuffix("Pil") for _, p in _processors()} | {"VideoMAEVideoProcessor"}
    assert set(REPRODUCED) <= tested, set(REPRODUCED) - tested


def test_a_video_processor_config_alone_is_read_from_its_json(tmp_path) -> None:
    """A checkpoint saved with a video processor has only ``video_preprocessor_config.json``, whose class
    needs torchvision (absent here): the build reads the file itself. The file is what
    ``VideoMAEVideoProcessor.save_pretrained`` writes (the image processor's fields, its video keys, its
    class under ``video_processor_type``); the frames must come out as the PIL image processor makes them."""
    import json

    from transformers.models.videomae.image_processing_pil_videomae import VideoMAEImageProcessorPil

    from veo_edge.models.huggingface import load_preprocess

    proc = VideoMAEImageProcessorPil(
        size={"shortest_edge": 36},
        crop_size={"height": 32, "width": 32},
        resample=3,
        image_mean=[0.4, 0.45, 0.5],
        image_std=[0.2, 0.25, 0.3],
    )
    saved = {k: v for k, v in proc.to_dict().items() if k != "image_processor_type"}
    saved |= {"video_processor_type": "VideoMAEVideoProcessor", "do_sample_frames": False, "num_frames": None}
    saved |= {"fps": None, "default_to_square": False, "do_convert_rgb": True}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(saved, indent=2, sort_keys=True))
    with pytest.raises(OSError):  # what sends load_preprocess to the file
        transformers.AutoImageProcessor.from_pretrained(tmp_path, backend="pil")

    ours = Preprocess.from_manifest(load_preprocess(tmp_path, "video").to_manifest())
    assert (ours.processor, ours.resample, ours.image_std) == ("VideoMAEVideoProcessor", 3, (0.2, 0.25, 0.3))
    for im in _photos()[:1] + _digit_pictures()[:2]:
        ref = proc([im], return_tensors="np")["pixel_values"][0][0]
        got = ours(im)
        assert got.shape == ref.shape == (3, 32, 32)
        assert float(np.abs(got - ref.astype(np.float32)).max()) <= TOL


def test_the_digits_preprocessing_reads_a_rendered_scan_as_the_scan() -> None:
    from sklearn.datasets import load_digits

    scans = load_digits().images[:20]
    prep = Preprocess.from_manifest(digits.picture_preprocess())
    got = np.stack([prep(Image.fromarray(digits.render(s))) for s in scans])
    want = digits.preprocess(scans)
    # rendering rounds a level to the nearest of 256 grey values: half a grey step, times 2/255
    assert float(np.abs(got - want).max()) <= 1 / 255 + 1e-6


def test_frames_are_evenly_spaced_over_a_clip() -> None:
    assert sample_frames(16, 4) == [2, 6, 10, 14]
    assert sample_frames(3, 6) == [0, 0, 1, 1, 2, 2]  # a short clip repeats frames
    assert sample_frames(8, 8) == list(range(8))
    with pytest.raises(InputError, match="no frames"):
        sample_frames(0, 4)


def _png(w: int, h: int) -> bytes:
    """A valid all-black grey PNG of w x h, written chunk by chunk (Pillow takes seconds to encode one)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z = zlib.compressobj(9)
    row = bytes(w + 1)  # filter byte 0, then w zero pixels
    body = b"".join(z.compress(row) for _ in range(h)) + z.flush()
    head = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def test_a_decompression_bomb_is_refused_from_its_header() -> None:
    bomb = _png(10_000, 10_000)  # 100 MP of zeros: a few hundred kB compressed
    assert len(bomb) < 1_000_000
    with pytest.raises(InputError, match=r"10000x10000 = 100,000,000 pixels, over the limit of 40,000,000"):
        decode_image(bomb, "the upload")


def test_truncated_and_non_pictures_are_one_line_errors() -> None:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG")
    jpeg = buf.getvalue()
    with pytest.raises(InputError, match="truncated or corrupt"):
        decode_image(jpeg[: len(jpeg) // 2], "the upload")
    # cut inside its header: Pillow cannot even open it, but its first bytes say what it was
    for fmt, cut in (("JPEG", 200), ("PNG", 40), ("WebP", 30), ("BMP", 20)):
        buf = io.BytesIO()
        Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(buf, fmt.upper())
        with pytest.raises(InputError, match=rf"the upload starts as a {fmt} but is truncated or corrupt"):
            decode_image(buf.getvalue()[:cut], "the upload")
    with pytest.raises(InputError, match=r"not a picture Pillow can read \(11 bytes starting 0x68656c6c"):
        decode_image(b"hello world", "the upload")
    assert decode_image(jpeg).size == (64, 64)


#: preprocessor_config.json files in the forms Hub checkpoints of the supported families carry (legacy
#: feature-extractor keys, int sizes, reduce_labels, do_convert_rgb), at their usual sizes
HUB_SHAPED = {
    "clip": {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
             "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 224},
    "swin": {"do_normalize": True, "do_resize": True, "feature_extractor_type": "ViTFeatureExtractor",
             "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 3, "size": 224},
    "dinov2": {"crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True,
               "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.485, 0.456, 0.406],
               "image_processor_type": "BitImageProcessor", "image_std": [0.229, 0.224, 0.225], "resample": 3,
               "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 256}},
    "beit": {"crop_size": 224, "do_center_crop": False, "do_normalize": True, "do_resize": True,
             "feature_extractor_type": "BeitFeatureExtractor", "image_mean": [0.5, 0.5, 0.5],
             "image_std": [0.5, 0.5, 0.5], "reduce_labels": False, "resample": 2, "size": 224},
    "deit": {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
             "feature_extractor_type": "DeiTFeatureExtractor", "image_mean": [0.485, 0.456, 0.406],
             "image_std": [0.229, 0.224, 0.225], "resample": 3, "size": 256},
}  # fmt: skip


@pytest.mark.parametrize("family", list(HUB_SHAPED))
def test_processor_configs_as_checkpoints_carry_them_are_accepted_and_match(tmp_path, family) -> None:
    import json

    from veo_edge.models.huggingface import load_preprocess

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(HUB_SHAPED[family]))
    ours = Preprocess.from_manifest(load_preprocess(tmp_path, "image").to_manifest())
    proc = transformers.AutoImageProcessor.from_pretrained(tmp_path, backend="pil")
    for im in _photos()[:1]:
        ref = proc(im, return_tensors="np")["pixel_values"][0]
        got = ours(im)
        assert got.shape == ref.shape == (3, 224, 224)
        assert float(np.abs(got - ref.astype(np.float32)).max()) <= TOL

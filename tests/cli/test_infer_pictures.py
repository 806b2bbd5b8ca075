"""``veo-edge infer --image/--video``: pictures and clips in, label names out, through the build's own
preprocessing (the trained Hugging Face digits checkpoint; a tiny VideoMAE for clips, as a folder of
frames and as a video file PyAV decodes), and the refusals a user meets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.hf import FORMATS, digit_pictures, hf_digits_build, hf_video_build

transformers = pytest.importorskip("transformers", reason="transformers is not installed (hf extra)")


@pytest.fixture(scope="session")
def hf_digits(tmp_path_factory) -> Path:
    return hf_digits_build(tmp_path_factory)


@pytest.fixture(scope="session")
def hf_video(tmp_path_factory) -> Path:
    return hf_video_build(tmp_path_factory)


def _infer(capsys, *args) -> tuple[int, str, str]:
    """``veo-edge infer ARGS`` in this process (the builds' imports are paid once): (exit code, out, err)."""
    from veo_edge.cli.main import main

    code = 0
    try:
        main(["infer", *map(str, args)])
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_pictures_of_digits_get_their_label_names(hf_digits, tmp_path, capsys) -> None:
    files, want = [], []
    for i, fmt in enumerate(FORMATS):
        pictures, y = digit_pictures(2 * (i + 1), fmt, size=8 + 8 * i)  # 8x8 .. 32x32, resized by the build
        for j in (-2, -1):
            path = tmp_path / f"d{i}{j}.{fmt.lower()}"
            path.write_bytes(pictures[j])
            files.append(path)
            want.append(f"digit {y[j]}")
    code, out, err = _infer(capsys, hf_digits, *(a for f in files for a in ("--image", f)), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["input_shape"] == [len(files), 1, 32, 32]
    assert [row[0]["label"] for row in result["top_k"]] == want
    assert result["inputs"] == [str(f) for f in files]  # which picture each row answers
    code, out, _ = _infer(capsys, hf_digits, "--image", files[0], "--top-k", "2")
    assert code == 0 and f"{files[0]}: {want[0]} (logit " in out  # the number says what it is


@pytest.mark.slow
def test_what_infer_refuses_is_one_line(hf_digits, hf_video, tmp_path, capsys) -> None:
    (tmp_path / "note.png").write_text("not a picture")
    code, _, err = _infer(capsys, hf_digits, "--image", tmp_path / "note.png")
    assert code == 4 and "--image " in err and "note.png is not a picture Pillow can read" in err
    code, _, err = _infer(capsys, hf_digits, "--video", tmp_path)
    assert code == 2 and "hf-vit-digits is an image model; pass --image, not --video" in err
    code, _, err = _infer(capsys, hf_video, "--image", tmp_path / "note.png")
    assert code == 2 and "is a video model (4 frames a clip); pass --video clip.mp4" in err


def _frames(n: int) -> list:
    """``n`` frames of a seeded moving pattern, 48x40 (the processor resizes and crops them)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
    return [Image.fromarray(np.roll(base, 3 * t, axis=1)) for t in range(n)]


@pytest.mark.slow
def test_a_clip_as_frames_and_as_a_video_file_gives_the_models_answer(hf_video, tmp_path, capsys) -> None:
    import av
    import torch

    frames = _frames(8)
    folder = tmp_path / "frames"
    folder.mkdir()
    for t, im in enumerate(frames):
        im.save(folder / f"{t:03d}.png")
    clip = tmp_path / "clip.mov"  # lossless (PNG frames in QuickTime): the decoded frames are the frames
    with av.open(str(clip), "w") as container:
        stream = container.add_stream("png", rate=8)
        stream.width, stream.height, stream.pix_fmt = 48, 40, "rgb24"
        for im in frames:
            container.mux(stream.encode(av.VideoFrame.from_image(im)))
        container.mux(stream.encode())
    code, out, err = _infer(capsys, hf_video, "--video", folder, "--json", "--top-k", "3")
    assert code == 0, err
    from_folder = json.loads(out)
    code, out, err = _infer(capsys, hf_video, "--video", clip, "--json", "--top-k", "3")
    assert code == 0, err
    from_file = json.loads(out)
    assert from_folder["input_shape"] == [1, 4, 3, 32, 32]
    assert from_file["top_k"] == from_folder["top_k"]
    assert (from_folder["inputs"], from_file["inputs"]) == ([str(folder)], [str(clip)])
    # --video repeats as --image does: one clip a row, each row named by its clip (it printed "sample 0",
    # and a second --video silently replaced the first)
    code, out, err = _infer(capsys, hf_video, "--video", folder, "--video", clip, "--json", "--top-k", "3")
    assert code == 0, err
    both = json.loads(out)
    assert both["input_shape"] == [2, 4, 3, 32, 32] and both["inputs"] == [str(folder), str(clip)]
    assert both["top_k"][1] == from_file["top_k"][0]
    np.testing.assert_allclose(
        [t["logit"] for t in both["top_k"][0]], [t["logit"] for t in from_folder["top_k"][0]], atol=1e-5
    )
    code, out, err = _infer(capsys, hf_video, "--video", clip, "--top-k", "1")
    assert code == 0 and f"  {clip}: " in out and "sample 0" not in out, out
    # the reference: Hugging Face's own processor on frames 1, 3, 5, 7 (4 evenly spaced of 8), its model
    ckpt = hf_video.parent / "videomae-ckpt"
    proc = transformers.VideoMAEImageProcessorPil.from_pretrained(ckpt)
    pixels = proc([frames[t] for t in (1, 3, 5, 7)], return_tensors="pt")["pixel_values"]
    model = transformers.VideoMAEForVideoClassification.from_pretrained(ckpt).eval()
    with torch.no_grad():
        want = model(pixel_values=pixels).logits[0].numpy()
    got = {t["label"]: t["logit"] for t in from_folder["top_k"][0]}
    assert list(got) == [model.config.id2label[int(i)] for i in np.argsort(-want)]
    labels = list(model.config.id2label.values())
    np.testing.assert_allclose([got[k] for k in labels], want, atol=1e-4)


def test_build_suggests_the_input_the_preprocessing_takes(hf_digits, hf_video, nano_build, capsys):
    """The build's "Next:" line: a picture for an image checkpoint, a clip for a video one, nothing for a
    build without preprocessing (infer runs seeded random input); each suggestion is what infer takes."""
    from veo_edge.builddir import BuildDir
    from veo_edge.cli.build import _example_input

    hints = [_example_input(BuildDir.open(b).manifest) for b in (hf_digits, hf_video, nano_build)]
    assert hints == [" --image PICTURE.jpg", " --video CLIP.mp4", ""]
    code, _, err = _infer(capsys, hf_video, "--image", "x.jpg")
    assert code == 2 and "pass --video" in err  # the other kind is refused: the hint is the one that fits

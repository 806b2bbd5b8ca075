"""``veo-edge infer``: run an input through a build with the runtime (backend selection and fallback)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from veo_edge.cli._common import console, print_json


def load_input(path: Path | None, batch: int, seed: int, input_shape: tuple[int, ...]):
    """A ``.npy`` file, or seeded random input of ``batch`` samples."""
    import numpy as np

    from veo_edge.errors import InputError

    if path is None:
        from veo_edge.export.parity import seeded_inputs

        return seeded_inputs(input_shape, batch, seed)
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise InputError(f"cannot read input {path}: {e.strerror or e}") from e
    if magic != b"\x93NUMPY":  # numpy's own error for another file talks of pickles
        from veo_edge.preprocess.decode import IMAGE_SUFFIXES, VIDEO_SUFFIXES

        suffix = Path(path).suffix.lower()
        hint = (
            "; for a picture use --image"
            if suffix in IMAGE_SUFFIXES
            else "; for a clip use --video"
            if suffix in VIDEO_SUFFIXES
            else ""
        )
        raise InputError(f"input {path} is not a .npy file (numpy.save writes one){hint}")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read input {path}: {e}; expected a .npy file written by numpy.save") from e
    if arr.ndim == len(input_shape):  # one sample without the batch axis
        arr = arr[None]
    return arr


def load_pictures(build, images: list[Path], videos: list[Path]):
    """``--image`` files or ``--video`` clips (one sample each, in order), preprocessed as the build's
    manifest says."""
    import numpy as np

    from veo_edge.errors import UsageError
    from veo_edge.preprocess import Preprocess
    from veo_edge.preprocess.decode import read_clip, read_image

    spec = build.manifest.get("preprocess")
    if not spec:
        raise UsageError(
            f"{build.path} records no preprocessing, so it cannot take pictures; pass --input x.npy "
            "(preprocessed tensors), or build it with --hf without --no-preprocess (or from a built-in model "
            "that has one)"
        )
    prep = Preprocess.from_manifest(spec)
    video_build = prep.num_frames is not None
    if images and video_build:
        raise UsageError(
            f"{build.model_name} is a video model ({prep.num_frames} frames a clip); pass --video clip.mp4 or "
            "--video frames_dir/, not --image"
        )
    if videos and not video_build:
        raise UsageError(f"{build.model_name} is an image model; pass --image, not --video")
    if videos:
        return np.stack([prep.clip(read_clip(v)) for v in videos])
    return prep.batch([read_image(p) for p in images])


def infer(
    build_dir: Path = typer.Argument(..., help="A build directory made by `veo-edge build`."),
    input_file: Path = typer.Option(None, "--input", "-i", help="Input .npy (one sample or a batch)."),
    image: list[Path] = typer.Option(
        None,
        "--image",
        help="A picture (JPEG, PNG, WebP, BMP); repeat for a batch. Needs a build with preprocessing.",
    ),
    video: list[Path] = typer.Option(
        None,
        "--video",
        help="A clip for a video build: a video file (PyAV) or a folder of frames; repeat for a batch.",
    ),
    batch: int = typer.Option(
        1, "--batch", min=1, help="Batch size of the seeded random input (without --input)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random input."),
    backend: str = typer.Option(
        "auto",
        "--backend",
        "-b",
        help="auto (tensorrt -> onnxruntime-cuda -> openvino), tensorrt, onnxruntime-cuda, onnxruntime or openvino.",
    ),
    no_fallback: bool = typer.Option(
        False, "--no-fallback", help="Fail instead of falling back to a slower backend."
    ),
    gpu_memory_budget: str = typer.Option(
        None, "--gpu-memory-budget", help="Most GPU memory a GPU backend may need, e.g. 2G or 512MiB."
    ),
    gpu: int = typer.Option(0, "--gpu", min=0, help="CUDA device index of the GPU backends."),
    top_k: int = typer.Option(5, "--top-k", min=1, help="Classes to show per sample."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Run an input through a build on the best backend here; print the top classes and skip reasons."""
    import numpy as np

    from veo_edge.runtime.runtime import Runtime

    rt = Runtime(
        build_dir, backend=backend, fallback=not no_fallback, gpu_memory_budget=gpu_memory_budget, gpu=gpu
    )
    given = [f for f, v in (("--input", input_file), ("--image", image), ("--video", video)) if v]
    if len(given) > 1:
        from veo_edge.errors import UsageError

        raise UsageError(f"{' and '.join(given)} were both given; choose one input")
    if image or video:
        x = load_pictures(rt.build, list(image or []), list(video or []))
    else:
        x = load_input(input_file, batch, seed, rt.input_shape)
    labels = rt.build.manifest.get("labels") or None
    pictures = list(image or video or [])  # the files the rows answer, in order
    with rt.start():
        start = time.perf_counter()
        logits = rt.infer(x)
        latency_ms = (time.perf_counter() - start) * 1e3
        described = rt.describe()
        state = rt.state
    # what the model serves: class scores, or (a Hugging Face backbone, CLIP, SigLIP) features
    served = rt.build.served_output
    result = {
        "model": rt.build.model_name,
        "backend": state.active_backend,
        "precision": described.get("precision"),
        "backend_info": described,
        "skipped": state.skipped,
        "switches": state.switches,
        "input_shape": list(x.shape),
        "output_shape": list(logits.shape),
        "latency_ms": round(latency_ms, 3),
        "output": served,
        # which input each row of top_k / values answers (pictures, clips: their files, in order)
        "inputs": [str(p) for p in pictures] if pictures else None,
    }
    if served == "logits":
        top = np.argsort(-logits, axis=-1)[:, : min(top_k, logits.shape[-1])]
        result["top_k"] = [
            [
                {"class": int(c), "logit": float(logits[i, c])}
                | ({"label": labels[c]} if labels and c < len(labels) else {})
                for c in row
            ]
            for i, row in enumerate(top)
        ]
    else:  # features have no classes to rank: each sample's values, and their L2 norm
        result["values"] = logits.tolist()
    bad = int(np.size(x) - np.count_nonzero(np.isfinite(x))) if np.issubdtype(x.dtype, np.floating) else 0
    if bad:  # a NaN or an infinity in, NaN out: said, not answered as if it were a result
        result["warning"] = (
            f"the input holds {bad} NaN or infinite values of {np.size(x)}; outputs follow from them"
        )
        console(stderr=True).print(f"warning: {result['warning']}", markup=False, soft_wrap=True)
    if json_out:
        print_json(result)
        return
    c = console()
    c.print(
        f"{rt.build.model_name} on [bold]{state.active_backend}[/]: input {tuple(x.shape)} -> output "
        f"{tuple(logits.shape)} in {latency_ms:.1f} ms ({result['precision'] or 'precision unknown'})"
    )
    if described.get("precision_note"):
        c.print(f"  note: {described['precision_note']}", soft_wrap=True)
    for skip in state.skipped:
        c.print(f"  skipped {skip['backend']}: {skip['reason']}", soft_wrap=True)
    for sw in state.switches:
        c.print(f"  switched {sw['from']} -> {sw['to']}: {sw['reason']}", soft_wrap=True)
    for i in range(min(len(logits), 8)):
        if pictures and i < len(pictures):
            name = str(pictures[i])
        elif input_file is None:  # no input given: say the answer is to random data
            name = f"random sample {i} (seed {seed})"
        else:
            name = f"sample {i}"
        if served == "logits":
            said = ", ".join(
                f"{t.get('label', t['class'])} (logit {t['logit']:.3f})" for t in result["top_k"][i]
            )
        else:
            v = logits[i].ravel()
            head = ", ".join(f"{x:.4f}" for x in v[:4]) + (", ..." if v.size > 4 else "")
            said = f"{served} {list(logits[i].shape)}: {head} (L2 norm {float(np.linalg.norm(v)):.4f})"
        c.print(f"  {name}: {said}", markup=False, soft_wrap=True)
    if len(logits) > 8:
        c.print(f"  ... {len(logits) - 8} more samples (use --json for all)")


def register(app: typer.Typer) -> None:
    app.command("infer")(infer)

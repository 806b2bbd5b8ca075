"""Our IR (`veo-edge build --hf`) against optimum-intel's (`optimum-cli export openvino`) on one checkpoint.

    python bench/hf.py --optimum-python PATH/venv-with-optimum-intel/bin/python
                       [--work DIR] [--seconds 4] [--rounds 3] [--samples 64] [--json PATH]

optimum-intel 2.2 needs transformers < 5.6, so it runs from its own venv (as Triton runs from PyTriton's):
only its export runs there; both IRs are then read and compiled here, by the same OpenVINO, under the same
settings (f32 stated, the input fixed at [1, 3, 224, 224], the same hint and threads).

The checkpoint (``bench/serve.py images`` serves it too): a seeded random-init ViT (192 wide, 12 layers,
224²). Reported:
- top-1 agreement and the largest logit difference on ``--samples`` seeded inputs and the two sample
  photographs (preprocessed by the build's manifest);
- latency: p50 of back-to-back sync infers on a LATENCY compile, batch 1;
- throughput: an AsyncInferQueue kept full on a THROUGHPUT compile, batch 1;
each ours / optimum's, interleaved ``--rounds`` times (medians); and the ops in each IR.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import raw_ov
import report


def hf_checkpoint(out: Path, seed: int = 0) -> Path:
    """A seeded random-init ViT (192 wide, 12 layers, 3 heads, 16x16 patches, 224², ViT's processor) as
    ``save_pretrained`` writes it, into ``out`` (once)."""
    if (out / "config.json").is_file():
        return out
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    labels = {i: f"class {i}" for i in range(1000)}
    config = tf.ViTConfig(
        image_size=224,
        patch_size=16,
        hidden_size=192,
        num_hidden_layers=12,
        num_attention_heads=3,
        intermediate_size=768,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    tf.ViTForImageClassification(config).eval().save_pretrained(out)
    tf.ViTImageProcessorPil().save_pretrained(out)  # 224² bilinear, mean/std 0.5, as google/vit-base-* has
    return out


def hf_build(ckpt: Path, out: Path) -> Path:
    """``veo-edge build --hf ckpt --out out`` (once; f32, the default max batch 8)."""
    if (out / "manifest.json").is_file():
        return out
    from veo_edge.export.hf_source import HuggingFaceSource
    from veo_edge.pipeline.build import BuildOptions, run_build

    run_build(BuildOptions(source=HuggingFaceSource(str(ckpt)), out=out, quiet=True))
    return out


def photos_jpeg(quality: int = 90) -> list[bytes]:
    """scikit-learn's two sample photographs (427x640 RGB) as JPEG files."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    out = []
    for a in load_sample_images().images:
        buf = io.BytesIO()
        Image.fromarray(np.asarray(a)).save(buf, "JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def export_optimum(python: str, ckpt: Path, out: Path) -> Path:
    """``optimum-cli export openvino`` of ``ckpt`` into ``out`` (once), from ``python``'s venv."""
    if not (out / "openvino_model.xml").is_file():
        cli = str(Path(python).parent / "optimum-cli")
        cmd = [cli, "export", "openvino", "--model", str(ckpt), "--task", "image-classification", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"optimum-cli failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out / "openvino_model.xml"


def inputs(build: Path, samples: int) -> np.ndarray:
    """``samples`` seeded inputs and the two photographs, preprocessed as the build's manifest says."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    from veo_edge.builddir import BuildDir
    from veo_edge.export.parity import seeded_inputs
    from veo_edge.preprocess import Preprocess

    prep = Preprocess.from_manifest(BuildDir.open(build).manifest["preprocess"])
    photos = np.stack([prep(Image.fromarray(a)) for a in load_sample_images().images])
    return np.concatenate([seeded_inputs((3, 224, 224), samples, 0), photos]).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--optimum-python", required=True, help="the Python of a venv with optimum-intel")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "veo-bench-hf", help="reused")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here, as JSON")
    args = ap.parse_args()
    import openvino as ov

    ckpt = hf_checkpoint(args.work / "vit-hf")
    build = hf_build(ckpt, args.work / "vit-hf-build")
    core = ov.Core()
    irs = {}
    for name, xml in (
        ("ours", build / "openvino" / "model.xml"),
        ("optimum", export_optimum(args.optimum_python, ckpt, args.work / "vit-hf-optimum")),
    ):
        irs[name] = core.read_model(str(xml))
        irs[name].reshape({irs[name].inputs[0]: ov.PartialShape([1, 3, 224, 224])})
    code = "import importlib.metadata as m; print(*(m.version(p) for p in ('optimum-intel', 'transformers', 'openvino')))"
    versions = subprocess.run(
        [args.optimum_python, "-c", code], capture_output=True, text=True
    ).stdout.split()

    x = inputs(build, args.samples)
    logits = {}
    for name, model in irs.items():
        compiled = raw_ov.compile_ir(model, "LATENCY")
        logits[name] = np.concatenate([compiled([x[i : i + 1]])[0] for i in range(len(x))])
    agree = float((logits["ours"].argmax(1) == logits["optimum"].argmax(1)).mean())
    diff = float(np.abs(logits["ours"] - logits["optimum"]).max())

    lat: dict[str, list[float]] = {"ours": [], "optimum": []}
    thr: dict[str, list[float]] = {"ours": [], "optimum": []}
    for r in range(args.rounds):
        for name in ("ours", "optimum") if r % 2 == 0 else ("optimum", "ours"):
            lat[name].append(
                raw_ov.time_sync(
                    raw_ov.compile_ir(irs[name], "LATENCY").create_infer_request(), x[:1], args.seconds
                )["p50"]
            )
            thr[name].append(
                raw_ov.keep_full(raw_ov.compile_ir(irs[name], "THROUGHPUT"), x[:1], args.seconds)["rate"]
            )
        print(
            f"round {r + 1}: " + ", ".join(f"{n} p50 {lat[n][-1]:.2f} ms {thr[n][-1]:.1f}/s" for n in lat),
            flush=True,
        )
    table = report.Table(
        f"our IR against optimum-intel's: top-1 agreement {agree:.0%} on {len(x)} inputs, max |logit diff| {diff:.2g}",
        {
            "ir": ("IR", "{}"),
            "ops": ("ops", "{}"),
            "p50_ms": ("p50 ms (LATENCY, b1)", "{:.2f}"),
            "rate": ("images/s (THROUGHPUT, b1)", "{:.1f}"),
        },
    )
    for name, label in (("ours", "ours (`build --hf`)"), ("optimum", "optimum-intel")):
        table.add(
            ir=label,
            ops=len(irs[name].get_ops()),
            p50_ms=statistics.median(lat[name]),
            rate=statistics.median(thr[name]),
        )
    ratio = report.Table(
        "ours / optimum", {"latency": ("latency", "{:.3f}×"), "throughput": ("throughput", "{:.3f}×")}
    )
    ratio.add(
        latency=table.rows[0]["p50_ms"] / table.rows[1]["p50_ms"],
        throughput=table.rows[0]["rate"] / table.rows[1]["rate"],
    )
    meta = dict(zip(("optimum_intel", "optimum_transformers", "optimum_openvino"), versions, strict=False))
    report.emit([table, ratio], args.json, agreement=agree, max_logit_diff=diff, inputs=len(x), **meta)


if __name__ == "__main__":
    main()

"""Shared by the Hugging Face benches: a random-init ViT checkpoint (seeded; 192 wide, 12 layers, 3 heads,
16x16 patches, 224², ViT's processor) as ``save_pretrained`` writes it, and its ``build --hf``; photographs
to feed it (scikit-learn's two sample images, as JPEG)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np


def vit_checkpoint(out: Path, seed: int = 0) -> Path:
    """Write the checkpoint into ``out`` (once) and return it."""
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

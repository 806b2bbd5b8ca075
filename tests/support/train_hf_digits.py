"""Train a Hugging Face ``ViTForImageClassification`` on scikit-learn's digits by vit-digits' recipe
(``veo_edge.models.train_digits``: 100 epochs, AdamW, shifts of up to one pixel, label smoothing) and
save it with ``save_pretrained``, its image processor and ``id2label``: a real trained checkpoint for
the ``build --hf`` tests, made here (no hub).

    python tests/support/train_hf_digits.py [--out tests/data/hf-vit-digits]

The model is vit-digits' shape (4 blocks, 64 wide, 2 heads, 8x8 patches, MLP 256) with what
``ViTForImageClassification`` adds: a class token, whose final state the head reads (vit-digits
averages the patch tokens). Trained from scratch by the recipe it reaches 93.33 % on the test split
(``--from-scratch``; 8x8 patches; 4x4 patches and transformers' own initialisation train slower still),
short of vit-digits' 98.15 %: the class token learns less from 1,257 scans than a mean does. So the
committed checkpoint starts from vit-digits' shipped weights where the architectures agree
(:func:`start_from_vit_digits`) and is then trained by the same recipe, all 100 epochs.

Deterministic as vit-digits' training is (seed 0, one thread, deterministic torch algorithms; the model
is built after the seed is set): a rerun with the same torch and transformers reproduces the committed
weights tensor for tensor.

The processor reads a grey picture with the ink bright on black (``veo_edge.models.digits.render``)
exactly as vit-digits' own preprocessing reads a scan: nearest-neighbour resize to 32x32, rescale by
2/255, normalise with mean 1 and std 1 (i.e. p * 2 / 255 - 1).
"""

from __future__ import annotations

import argparse
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "hf-vit-digits"


#: the committed checkpoint's shape: vit-digits' (see --patch-size / --intermediate-size to try others)
PATCH_SIZE = 8
INTERMEDIATE_SIZE = 256


def make_model(patch_size: int = PATCH_SIZE, intermediate_size: int = INTERMEDIATE_SIZE):
    """The model, initialised as vit-digits is (``veo_edge.models.vit.init_weights``: Xavier-uniform
    weights, normal(0.02) position embedding and class token), from torch's global seed: transformers'
    own normal(0.02) initialisation of a 64-wide model trains far slower on 1,257 samples."""
    import torch
    import transformers as tf

    labels = {i: f"digit {i}" for i in range(10)}
    config = tf.ViTConfig(
        image_size=32,
        patch_size=patch_size,
        num_channels=1,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=intermediate_size,
        num_labels=10,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    model = tf.ViTForImageClassification(config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.fill_(0.0)
            elif isinstance(module, torch.nn.Linear | torch.nn.Conv2d):
                w = module.weight
                bound = (6.0 / (w.shape[0] + w[0].numel())) ** 0.5
                w.uniform_(-bound, bound)
                if module.bias is not None:
                    module.bias.normal_(0.0, 1e-2)
        emb = model.vit.embeddings
        emb.cls_token.normal_(0.0, 0.02)
        emb.position_embeddings.normal_(0.0, 0.02)
    return model


def start_from_vit_digits(model) -> None:
    """Copy vit-digits' shipped weights into ``model`` where the two architectures agree (patch
    embedding, the 16 patch positions, the four blocks with qkv split into q/k/v, the last norm, the
    head); the class token and its position keep their initialisation and are learnt by the fine-tuning."""
    import torch

    from veo_edge.models import create_model

    src = create_model("vit-digits").module.state_dict()
    dst = model.state_dict()
    pairs = {
        "vit.embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
        "vit.embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
        "vit.layernorm.weight": "fc_norm.weight",
        "vit.layernorm.bias": "fc_norm.bias",
        "classifier.weight": "head.weight",
        "classifier.bias": "head.bias",
    }
    for i in range(model.config.num_hidden_layers):
        ours, theirs = f"vit.layers.{i}.", f"blocks.{i}."
        for a, b in (
            ("layernorm_before", "norm1"),
            ("layernorm_after", "norm2"),
            ("attention.o_proj", "attn.proj"),
            ("mlp.fc1", "mlp.fc1"),
            ("mlp.fc2", "mlp.fc2"),
        ):
            for leaf in ("weight", "bias"):
                pairs[f"{ours}{a}.{leaf}"] = f"{theirs}{b}.{leaf}"
    with torch.no_grad():
        for ours, theirs in pairs.items():
            dst[ours].copy_(src[theirs])
        for i in range(model.config.num_hidden_layers):
            for leaf in ("weight", "bias"):
                q, k, v = src[f"blocks.{i}.attn.qkv.{leaf}"].chunk(3)
                for name, part in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                    dst[f"vit.layers.{i}.attention.{name}.{leaf}"].copy_(part)
        dst["vit.embeddings.position_embeddings"][:, 1:].copy_(src["pos_embed"])


def store_half(path: Path) -> None:
    """Rewrite the weights as float16: half the bytes in the repository (0.4 MB). config.json still says
    float32, so transformers loads them as float32 (each weight rounded to float16, which leaves the
    test-split accuracy as it was)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(path))
    save_file({k: v.half() for k, v in weights.items()}, str(path), metadata={"format": "pt"})


def make_processor():
    import transformers as tf

    return tf.ViTImageProcessorPil(
        size={"height": 32, "width": 32},
        resample=0,
        do_rescale=True,
        rescale_factor=2 / 255,
        do_normalize=True,
        image_mean=[1.0],
        image_std=[1.0],
    )


class _Logits:
    """(N, 1, 32, 32) -> logits, for the shared training loop."""

    def __new__(cls, model):
        import torch

        class Logits(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, x):
                return self.model(pixel_values=x).logits

        return Logits()


def main() -> None:
    from veo_edge.models.train_digits import EPOCHS, train

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--patch-size", type=int, default=PATCH_SIZE)
    ap.add_argument("--intermediate-size", type=int, default=INTERMEDIATE_SIZE)
    ap.add_argument("--from-scratch", action="store_true", help="Do not start from vit-digits' weights.")
    args = ap.parse_args()

    def make():  # called by train() after it seeds torch
        model = make_model(args.patch_size, args.intermediate_size)
        if not args.from_scratch:
            start_from_vit_digits(model)
        return _Logits(model)

    net = train(args.epochs, make_net=make)
    net.model.eval().save_pretrained(args.out)
    store_half(args.out / "model.safetensors")
    make_processor().save_pretrained(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Train a Hugging Face ``ViTForImageClassification`` on scikit-learn's digits by vit-digits' recipe
(``veo_edge.models.train_digits``) and save it with ``save_pretrained``, its image processor and
``id2label``: a real trained checkpoint for the ``build --hf`` tests, made here (no hub).

    python -m tests.support.train_hf_digits [--out tests/data/hf-vit-digits] [--epochs 100]

The processor reads a grey picture with the ink bright on black (``veo_edge.models.digits.render``)
exactly as vit-digits' own preprocessing reads a scan: nearest-neighbour resize to 32x32, rescale by
2/255, normalise with mean 1 and std 1 (i.e. p * 2 / 255 - 1).
"""

from __future__ import annotations

import argparse
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "hf-vit-digits"


def make_model():
    import transformers as tf

    labels = {i: f"digit {i}" for i in range(10)}
    config = tf.ViTConfig(
        image_size=32,
        patch_size=4,  # one original pixel a patch: 64 tokens (8x8 patches gave 94.6 % with a cls token)
        num_channels=1,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=256,
        num_labels=10,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    return tf.ViTForImageClassification(config)


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
    args = ap.parse_args()
    model = make_model()
    train(args.epochs, make_net=lambda: _Logits(model))
    model.eval().save_pretrained(args.out)
    make_processor().save_pretrained(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

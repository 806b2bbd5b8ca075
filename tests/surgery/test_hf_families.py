"""Hugging Face ``transformers`` ViT families (small random configs, nothing downloaded) exported by
both exporters and built with ``build --onnx``: what fuses, what is left alone and why.

Relative position biases (BEiT, Swin) and Swin's shifted-window masks are given random values, as a
trained model has: an all-zero table (the library's initialisation) would be folded away as a no-op."""

from __future__ import annotations

import json

import onnx
import pytest

transformers = pytest.importorskip("transformers", reason="transformers is not installed (dev extra)")
torch = pytest.importorskip("torch")

from veo_edge.export.onnx_export import OnnxExport  # noqa: E402
from veo_edge.export.source import OnnxSource  # noqa: E402
from veo_edge.pipeline.build import BuildOptions, run_build  # noqa: E402

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
IMAGE = {"image_size": 32, "patch_size": 8, "num_labels": 5}


def _family(name: str):
    """(model, input shape) for a family."""
    tf = transformers
    if name == "vit":
        return tf.ViTForImageClassification(tf.ViTConfig(**IMAGE, **SMALL)), (3, 32, 32)
    if name == "deit":
        return tf.DeiTForImageClassificationWithTeacher(tf.DeiTConfig(**IMAGE, **SMALL)), (3, 32, 32)
    if name == "dinov2":
        return tf.Dinov2ForImageClassification(tf.Dinov2Config(**IMAGE, **SMALL)), (3, 32, 32)
    if name == "beit":
        cfg = tf.BeitConfig(**IMAGE, **SMALL, use_relative_position_bias=True)
        return tf.BeitForImageClassification(cfg), (3, 32, 32)
    if name == "swin":
        cfg = tf.SwinConfig(
            image_size=32, patch_size=4, embed_dim=16, depths=[2], num_heads=[2], window_size=4, num_labels=5
        )
        return tf.SwinForImageClassification(cfg), (3, 32, 32)
    if name == "videomae":
        cfg = tf.VideoMAEConfig(**IMAGE, **SMALL, num_frames=4, tubelet_size=2)
        return tf.VideoMAEForVideoClassification(cfg), (4, 3, 32, 32)
    if name == "timesformer":
        cfg = tf.TimesformerConfig(**IMAGE, **SMALL, num_frames=4)
        return tf.TimesformerForVideoClassification(cfg), (4, 3, 32, 32)
    raise ValueError(name)


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits


def _trained_looking(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        if "relative_position_bias_table" in name:
            torch.nn.init.normal_(p, 0.0, 0.5)


#: (family, exporter) -> (attention fused, attention candidates, why the rest was left alone)
EXPECT = {
    ("vit", "torchscript"): (2, 2, set()),
    ("deit", "torchscript"): (2, 2, set()),
    ("dinov2", "torchscript"): (2, 2, set()),
    ("beit", "torchscript"): (0, 2, {"no_mask"}),
    ("swin", "torchscript"): (0, 2, {"no_mask"}),
    ("videomae", "torchscript"): (2, 2, set()),
    ("timesformer", "torchscript"): (4, 4, set()),
    ("vit", "dynamo"): (2, 2, set()),
    ("videomae", "dynamo"): (2, 2, set()),
}


@pytest.mark.slow
@pytest.mark.parametrize("family, exporter", list(EXPECT), ids=[f"{f}-{e}" for f, e in EXPECT])
def test_a_hugging_face_family_builds_with_what_fuses_said_per_family(family, exporter, tmp_path):
    torch.manual_seed(0)
    model, shape = _family(family)
    _trained_looking(model)
    net = Logits(model.eval()).eval()
    path = tmp_path / f"{family}.onnx"
    OnnxExport(opset=18 if exporter == "dynamo" else 17, exporter=exporter, max_batch=2)(net, shape, path)
    # dynamo writes the weights next to the graph (.onnx.data), which `build --onnx` does not copy yet:
    # hand it one self-contained file, as a user would
    onnx.save(onnx.load(str(path)), str(path))
    res = run_build(BuildOptions(source=OnnxSource(path), out=tmp_path / "b", quiet=True, max_batch=2))
    report = json.loads((tmp_path / "b" / "surgery_report.json").read_text())
    fused, candidates, left = EXPECT[(family, exporter)]
    attention = report["families"]["attention"]
    print(f"{family}/{exporter}: " + json.dumps({k: v["fused"] for k, v in report["families"].items()}))
    assert (attention["fused"], attention["candidates"]) == (fused, candidates), report["families"]
    assert {g["check"] for g in attention["left_alone"]} == left
    if "no_mask" in left:
        assert "not supported by VeoAttention v1" in attention["left_alone"][0]["why"]
    patch = report["families"]["patch embedding"]
    assert patch["fused"] == 1, patch
    assert res.manifest["surgery"]["replaced"] == fused + 1
    assert all(c["passed"] for c in report["reference_check"])
    assert "plugins_onnx" in res.manifest["artifacts"]

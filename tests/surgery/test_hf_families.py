"""Hugging Face ``transformers`` ViT families (small random configs written by ``save_pretrained`` with
their image processors; nothing downloaded) built with ``build --hf``, by both exporters: what fuses, what
is left alone and why, and what the build records (labels, preprocessing, the served output).

Relative position biases (BEiT, Data2Vec-vision, Swin), Swin's shifted-window masks, and Swin V2's
continuous position bias MLP and per-head logit scales are given random values, as a trained model has: an
all-zero table (the library's initialisation) would be folded away as a no-op, and one logit scale shared by
every head (transformers' log(10)) is not what a trained Swin V2 has."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="transformers is not installed (dev extra)")
torch = pytest.importorskip("torch")

from veo_edge.builddir import BuildDir  # noqa: E402
from veo_edge.errors import ModelLoadError  # noqa: E402
from veo_edge.export.hf_source import HuggingFaceSource  # noqa: E402
from veo_edge.pipeline.build import BuildOptions, run_build  # noqa: E402
from veo_edge.runtime.runtime import Runtime  # noqa: E402
from veo_edge.serve.protocol import (  # noqa: E402
    ModelSpec,
    ProtocolError,
    RequestedOutput,
    check_requested_outputs,
)

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
LABELS = {0: "cat", 1: "dog", 2: "eel", 3: "fox", 4: "gnu"}
IMAGE = {"image_size": 32, "patch_size": 8, "id2label": LABELS, "label2id": {v: k for k, v in LABELS.items()}}
SQUARE = {"size": {"height": 32, "width": 32}}
CROP = {"size": {"shortest_edge": 36}, "crop_size": {"height": 32, "width": 32}}
#: a one-stage Swin (V1 or V2) of two blocks: unshifted, then shifted windows
WINDOWS = {
    "image_size": 32,
    "patch_size": 4,
    "embed_dim": 16,
    "depths": [2],
    "num_heads": [2],
    "window_size": 4,
}


def _family(name: str):
    """(model, processor) for a family."""
    tf = transformers
    if name == "vit":
        return tf.ViTForImageClassification(tf.ViTConfig(**IMAGE, **SMALL)), tf.ViTImageProcessorPil(**SQUARE)
    if name == "deit":
        model = tf.DeiTForImageClassificationWithTeacher(tf.DeiTConfig(**IMAGE, **SMALL))
        return model, tf.DeiTImageProcessorPil(size={"height": 36, "width": 36}, crop_size=CROP["crop_size"])
    if name == "dinov2":
        return tf.Dinov2ForImageClassification(tf.Dinov2Config(**IMAGE, **SMALL)), tf.BitImageProcessorPil(
            **CROP
        )
    if name == "dinov2_with_registers":  # 4 register tokens after the class token
        cfg = tf.Dinov2WithRegistersConfig(**IMAGE, **SMALL, num_register_tokens=4)
        return tf.Dinov2WithRegistersForImageClassification(cfg), tf.BitImageProcessorPil(**CROP)
    if name == "vit_msn":
        return tf.ViTMSNForImageClassification(tf.ViTMSNConfig(**IMAGE, **SMALL)), tf.ViTImageProcessorPil(
            **SQUARE
        )
    if name == "beit":
        cfg = tf.BeitConfig(**IMAGE, **SMALL, use_relative_position_bias=True)
        return tf.BeitForImageClassification(cfg), tf.BeitImageProcessorPil(**SQUARE, do_center_crop=False)
    if name == "data2vec-vision":
        cfg = tf.Data2VecVisionConfig(**IMAGE, **SMALL, use_relative_position_bias=True)
        return tf.Data2VecVisionForImageClassification(cfg), tf.BeitImageProcessorPil(
            **SQUARE, do_center_crop=False
        )
    if name in ("swin", "swinv2"):  # swinv2 as the Hub's swinv2-*: cosine attention, continuous position bias
        v2 = name == "swinv2"
        cfg = (tf.Swinv2Config if v2 else tf.SwinConfig)(**WINDOWS, id2label=LABELS)
        model = (tf.Swinv2ForImageClassification if v2 else tf.SwinForImageClassification)(cfg)
        return model, tf.ViTImageProcessorPil(**SQUARE)
    if name == "videomae":
        cfg = tf.VideoMAEConfig(**IMAGE, **SMALL, num_frames=4, tubelet_size=2)
        return tf.VideoMAEForVideoClassification(cfg), tf.VideoMAEImageProcessorPil(**CROP)
    if name == "timesformer":
        cfg = tf.TimesformerConfig(**IMAGE, **SMALL, num_frames=4)
        return tf.TimesformerForVideoClassification(cfg), tf.VideoMAEImageProcessorPil(**CROP)
    if name == "vivit":
        cfg = tf.VivitConfig(image_size=32, num_frames=4, tubelet_size=[2, 8, 8], id2label=LABELS, **SMALL)
        return tf.VivitForVideoClassification(cfg), tf.VivitImageProcessor(**CROP)
    raise ValueError(name)


def _trained_looking(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        if "relative_position_bias_table" in name or "continuous_position_bias_mlp" in name:
            torch.nn.init.normal_(p, 0.0, 0.5)
        elif name.endswith("logit_scale"):  # Swin V2: log of each head's scale (clamped at log 100)
            with torch.no_grad():
                p.copy_(torch.empty_like(p).uniform_(5.0, 30.0).log())


def save_checkpoint(family: str, path):
    """A save_pretrained directory of ``family``: the model and its processor."""
    torch.manual_seed(0)
    model, processor = _family(family)
    _trained_looking(model)
    model.eval().save_pretrained(path)
    processor.save_pretrained(path)
    return path


#: (family, exporter) -> (attention fused, attention candidates, why the rest was left alone)
EXPECT = {
    ("vit", "torchscript"): (2, 2, set()),
    ("deit", "torchscript"): (2, 2, set()),
    ("dinov2", "torchscript"): (2, 2, set()),
    ("dinov2_with_registers", "torchscript"): (2, 2, set()),
    ("vit_msn", "torchscript"): (2, 2, set()),
    ("beit", "torchscript"): (2, 2, set()),  # relative position bias: VeoAttention v2
    ("data2vec-vision", "torchscript"): (2, 2, set()),
    ("swin", "torchscript"): (2, 2, set()),  # windows, unshifted and shifted (bias + mask)
    ("swinv2", "torchscript"): (0, 2, {"scores_matmul", "bias_layout"}),  # cosine attention: see LEFT_DETAIL
    ("videomae", "torchscript"): (2, 2, set()),
    ("timesformer", "torchscript"): (4, 4, set()),
    ("vivit", "torchscript"): (2, 2, set()),
    ("vit", "dynamo"): (2, 2, set()),
    ("videomae", "dynamo"): (2, 2, set()),
}
VIDEO = {"videomae", "timesformer", "vivit"}
BIASED = {"beit", "data2vec-vision", "swin"}
#: family -> {check: what the region's detail says} for attention left alone. Swin V2's cosine attention
#: multiplies the scores by a per-head logit scale (a (H, 1, 1) constant, which the op's one scalar scale
#: cannot take), so the softmax reads a Mul; its shifted windows add the mask (twice, as transformers does)
#: to scores reshaped to (N/windows, windows, H, S, S), so a reshape sits between that Add and the softmax.
#: Past those, its Q and K are L2-normalised (Div), not projections, which the op does not compute either.
LEFT_DETAIL = {
    "swinv2": {
        "scores_matmul": "the softmax input comes from Mul",
        "bias_layout": "the softmax input comes from Add",
    }
}


@pytest.mark.slow
@pytest.mark.parametrize("family, exporter", list(EXPECT), ids=[f"{f}-{e}" for f, e in EXPECT])
def test_a_hugging_face_checkpoint_builds_with_what_fuses_said_per_family(family, exporter, tmp_path):
    ckpt = save_checkpoint(family, tmp_path / family)
    opts = BuildOptions(
        source=HuggingFaceSource(str(ckpt)),
        out=tmp_path / "b",
        quiet=True,
        max_batch=2,
        exporter=exporter,
        opset=18 if exporter == "dynamo" else 17,
    )
    res = run_build(opts)
    m = res.manifest
    # what the checkpoint knows is in the manifest
    assert m["labels"] == list(LABELS.values())
    assert m["model"]["config"]["model_type"] == family and m["model"]["config"]["output"] == "logits"
    assert [o["name"] for o in m["outputs"]] == ["logits"]
    prep = m["preprocess"]
    assert prep["num_frames"] == (4 if family in VIDEO else None)
    assert m["input_shape"] == ([4, 3, 32, 32] if family in VIDEO else [3, 32, 32])
    # parity: PyTorch vs ONNX Runtime and OpenVINO at batch 1 and 2, all passed (run_build raises otherwise)
    assert {(s["candidate"], s["batch"]) for s in m["parity"]} == {
        (c, b) for c in ("onnxruntime", "openvino") for b in (1, 2)
    }
    report = json.loads((tmp_path / "b" / "surgery_report.json").read_text())
    fused, candidates, left = EXPECT[(family, exporter)]
    attention = report["families"]["attention"]
    print(f"{family}/{exporter}: " + json.dumps({k: v["fused"] for k, v in report["families"].items()}))
    assert (attention["fused"], attention["candidates"]) == (fused, candidates), report["families"]
    assert {g["check"] for g in attention["left_alone"]} == left
    for check, detail in LEFT_DETAIL.get(family, {}).items():
        regions = [r for r in report["regions"] if r["op"] == "VeoAttention" and r["check"] == check]
        assert regions and all(detail in r["detail"] for r in regions), report["regions"]
    biased = [r["attrs"]["bias"] for r in report["regions"] if r["op"] == "VeoAttention" and r["replaced"]]
    assert all((b is not None) == (family in BIASED) for b in biased), biased
    patch = report["families"]["patch embedding"]
    assert patch["fused"] == 1, patch
    assert m["surgery"]["replaced"] == fused + 1
    assert all(c["passed"] for c in report["reference_check"])
    assert "plugins_onnx" in m["artifacts"]


#: a tiny text tower for the full CLIP and SigLIP checkpoints (its token ids inside its vocabulary); the build
#: neither loads nor builds it
TEXT = {"vocab_size": 99, "max_position_embeddings": 16, "bos_token_id": 0, "eos_token_id": 2, **SMALL}
TOWER = {"image_size": 32, "patch_size": 8, **SMALL}


def save_tower(family: str, path):
    """A save_pretrained directory of a CLIP or SigLIP checkpoint (``clip``, ``siglip``: text and vision;
    ``clip_vision_model``, ``clip_vision_model_projection``, ``siglip_vision_model``: a vision tower alone;
    ``clip_classification``: CLIPForImageClassification), with its processor. CLIP's projection (16) is
    narrower than its tower (32), as ViT-L/14's 768 from 1024."""
    tf = transformers
    torch.manual_seed(0)
    clip_proc = tf.CLIPImageProcessorPil(**CROP)  # shortest edge, centre crop, bicubic, CLIP's mean/std
    siglip_proc = tf.SiglipImageProcessorPil(**SQUARE)  # bicubic to 32x32, mean/std 0.5
    model, processor = {
        "clip": lambda: (
            tf.CLIPModel(tf.CLIPConfig(text_config=TEXT, vision_config=TOWER, projection_dim=16)),
            clip_proc,
        ),
        "clip_vision_model": lambda: (tf.CLIPVisionModel(tf.CLIPVisionConfig(**TOWER)), clip_proc),
        "clip_vision_model_projection": lambda: (
            tf.CLIPVisionModelWithProjection(tf.CLIPVisionConfig(**TOWER, projection_dim=16)),
            clip_proc,
        ),
        "siglip": lambda: (
            tf.SiglipModel(tf.SiglipConfig(text_config=TEXT, vision_config=TOWER)),
            siglip_proc,
        ),
        "siglip_vision_model": lambda: (tf.SiglipVisionModel(tf.SiglipVisionConfig(**TOWER)), siglip_proc),
        # a vision tower and a linear head on the mean of its patch tokens, no text tower
        "clip_classification": lambda: (
            tf.CLIPForImageClassification(
                tf.CLIPConfig(
                    text_config=TEXT,
                    vision_config=TOWER,
                    id2label=LABELS,
                    label2id={v: k for k, v in LABELS.items()},
                )
            ),
            clip_proc,
        ),
    }[family]()
    model.eval().save_pretrained(path)
    processor.save_pretrained(path)
    return path


def _image_features(model, x):
    """What ``get_image_features`` returns (transformers 5: an output whose pooler_output it is; 4: it)."""
    with torch.no_grad():
        out = model.get_image_features(pixel_values=x)
    return getattr(out, "pooler_output", out)


#: family -> (served output, its width, processor, attention fused of candidates, why the rest was left alone)
TOWERS = {
    "clip": ("image_embeds", 16, "CLIPImageProcessor", (2, 2), set()),
    # SigLIP's pooling head: nn.MultiheadAttention of one learned probe query over the encoder's tokens,
    # Q projected from the probe, K and V packed from the tokens: cross-attention, not VeoAttention's
    "siglip": ("pooler_output", 32, "SiglipImageProcessor", (2, 3), {"qkv_source"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(TOWERS))
def test_a_full_clip_or_siglip_checkpoint_builds_its_vision_towers_image_embeddings(family, tmp_path) -> None:
    """CLIPModel / SiglipModel (text and vision): the build serves what get_image_features returns (CLIP:
    the pooled output projected, unnormalised; SigLIP: its attention-pooling head), without the text tower,
    with the processor's preprocessing and no labels; no warning about the text config's token ids."""
    import logging

    import onnxruntime as ort
    from PIL import Image

    from veo_edge.preprocess import Preprocess

    ckpt = save_tower(family, tmp_path / family)
    warned: list[str] = []  # what transformers logs while it loads (its own handler writes to stderr)
    catch = logging.Handler(logging.WARNING)
    catch.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logging.Logger.warning_once.cache_clear()  # transformers warns once a process: this test's load warns anew
    logging.getLogger("transformers").addHandler(catch)
    try:
        res = run_build(
            BuildOptions(source=HuggingFaceSource(str(ckpt)), out=tmp_path / "b", quiet=True, max_batch=2)
        )
    finally:
        logging.getLogger("transformers").removeHandler(catch)
    assert not [w for w in warned if "_token_id must be" in w], warned
    m = res.manifest
    output, width, processor, (fused, candidates), left = TOWERS[family]
    config = m["model"]["config"]
    assert (config["model_type"], config["output"]) == (family, output)
    assert config["architecture"] == (
        "CLIPVisionModelWithProjection" if family == "clip" else "SiglipVisionModel"
    )
    assert m["outputs"] == [{"name": output, "shape": [-1, width], "dtype": "float32"}]  # what clients see
    assert m["input_shape"] == [3, 32, 32]
    assert "labels" not in m
    # a server of it (HTTP and gRPC check requests alike) ranks no classes of features
    spec = ModelSpec.from_manifest(m)
    assert spec.features == {output}
    with pytest.raises(ProtocolError, match="holds features, not class scores"):
        check_requested_outputs(spec, [RequestedOutput(output, True, 3)])
    check_requested_outputs(spec, [RequestedOutput(output, True)])
    assert any(
        n.startswith("the build serves the ") and "the text tower is not built" in n for n in res.notes
    )
    # the ONNX graph answers as transformers' own full model does
    full = (transformers.CLIPModel if family == "clip" else transformers.SiglipModel).from_pretrained(ckpt)
    x = torch.randn(2, 3, 32, 32)
    session = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    want = _image_features(full.eval(), x).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    # and so does the served IR, its input asked for by the ONNX model's name (CLIP casts its pixels first:
    # the converter had named the IR's input after that Cast, and every inference asked for the wrong name)
    with Runtime(BuildDir.open(tmp_path / "b"), backend="openvino").start() as rt:
        assert rt.describe()["precision"] == "f32"
        np.testing.assert_allclose(rt.infer(x.numpy()), want, atol=1e-4)
    if family == "clip":  # `veo-edge infer` shows features as features, not as classes
        np.save(tmp_path / "x.npy", x.numpy())
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "veo_edge.cli.main",
                "infer",
                str(tmp_path / "b"),
                "--input",
                str(tmp_path / "x.npy"),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        said = json.loads(r.stdout)
        assert said["output"] == "image_embeds" and "top_k" not in said and said["precision"] == "f32"
        np.testing.assert_allclose(np.array(said["values"]), want, atol=1e-4)
    assert {(s["candidate"], s["batch"]) for s in m["parity"]} == {
        (c, b) for c in ("onnxruntime", "openvino") for b in (1, 2)
    }
    # the preprocessing recorded is the processor's, and makes what it makes of a picture
    prep = m["preprocess"]
    proc = transformers.AutoImageProcessor.from_pretrained(ckpt, backend="pil")
    assert prep["processor"] == processor and prep["resample_name"] == "bicubic"
    assert prep["image_mean"] == pytest.approx(proc.image_mean) and prep["image_std"] == pytest.approx(
        proc.image_std
    )
    assert prep["size"] == ({"shortest_edge": 36} if family == "clip" else {"height": 32, "width": 32})
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (45, 60, 3), dtype=np.uint8))
    np.testing.assert_allclose(
        Preprocess.from_manifest(prep)(picture), proc(images=picture)["pixel_values"][0], atol=1e-4
    )
    # the surgery: the encoder's attention fuses as ViT's does; SigLIP's pooling head is left alone
    report = json.loads((tmp_path / "b" / "surgery_report.json").read_text())
    attention = report["families"]["attention"]
    print(f"{family}: " + json.dumps({k: v["fused"] for k, v in report["families"].items()}))
    assert (attention["fused"], attention["candidates"]) == (fused, candidates), report["families"]
    assert {g["check"] for g in attention["left_alone"]} == left
    alone = [r["anchor"] for r in report["regions"] if r["op"] == "VeoAttention" and not r["replaced"]]
    assert all("/head/attention/" in a for a in alone), alone
    assert report["families"]["patch embedding"]["fused"] == 1
    assert all(c["passed"] for c in report["reference_check"])


def test_clip_and_siglip_vision_towers_alone_serve_their_embeddings(tmp_path) -> None:
    """Standalone vision checkpoints: CLIPVisionModelWithProjection serves its image_embeds, CLIPVisionModel
    (no projection) and SiglipVisionModel their pooler_output; a full CLIP checkpoint takes its picture size
    from its vision config, and one that lacks a weight of its tower is refused in one line."""
    from veo_edge.models.huggingface import load

    x = torch.randn(2, 3, 32, 32)
    for family, output, served in (
        ("clip_vision_model_projection", "image_embeds", "the image embeddings of CLIP's vision tower"),
        ("clip_vision_model", "pooler_output", "the pooled output of CLIP's vision tower"),
        ("siglip_vision_model", "pooler_output", "the pooled output of SigLIP's vision tower"),
    ):
        ckpt = save_tower(family, tmp_path / family)
        hf = load(str(ckpt))
        assert (hf.output, hf.labels, hf.input_shape) == (output, None, (3, 32, 32))
        assert hf.architecture == type(hf.module.model).__name__
        assert any(n.startswith(f"the build serves {served} (") for n in hf.notes), hf.notes
        assert not any("text tower" in n for n in hf.notes)
        with torch.no_grad():
            want = getattr(type(hf.module.model).from_pretrained(ckpt).eval()(pixel_values=x), output)
            torch.testing.assert_close(hf.module(x), want)
    # a vision tower whose config names a projection its weights lack
    ckpt = tmp_path / "clip_vision_model"
    config = json.loads((ckpt / "config.json").read_text())
    config["architectures"] = ["CLIPVisionModelWithProjection"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelLoadError, match=r"lacks 1 of CLIPVisionModelWithProjection's weights \(visual_proj"
    ):
        load(str(ckpt))
    # CLIPForImageClassification: its logits, labelled, through the classification path
    ckpt = save_tower("clip_classification", tmp_path / "clip_classification")
    hf = load(str(ckpt))
    assert (hf.output, hf.labels, hf.input_shape) == ("logits", list(LABELS.values()), (3, 32, 32))
    assert hf.architecture == "CLIPForImageClassification" and hf.notes == []
    with torch.no_grad():
        want = transformers.CLIPForImageClassification.from_pretrained(ckpt).eval()(pixel_values=x).logits
        torch.testing.assert_close(hf.module(x), want)
    # a full checkpoint: the picture size is its vision tower's
    ckpt = save_tower("clip", tmp_path / "clip")
    transformers.CLIPImageProcessorPil(
        size={"height": 48, "width": 48}, do_center_crop=False
    ).save_pretrained(ckpt)
    with pytest.raises(ModelLoadError, match="the processor makes 48x48 pictures but the model takes 32x32"):
        load(str(ckpt))


def test_deit_serves_the_mean_of_its_two_heads(tmp_path) -> None:
    """What DeiTForImageClassificationWithTeacher returns: (cls head + distillation head) / 2."""
    from veo_edge.models.huggingface import load

    ckpt = save_checkpoint("deit", tmp_path / "deit")
    hf = load(str(ckpt))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = hf.module.model(pixel_values=x)
        served = hf.module(x)
    torch.testing.assert_close(served, (out.cls_logits + out.distillation_logits) / 2)
    assert hf.architecture == "DeiTForImageClassificationWithTeacher"


def test_a_bare_backbone_builds_with_its_pooled_output_and_says_so(tmp_path) -> None:
    tf = transformers
    torch.manual_seed(0)
    tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, **SMALL)).save_pretrained(tmp_path / "bare")
    tf.ViTImageProcessorPil(**SQUARE).save_pretrained(tmp_path / "bare")
    res = run_build(
        BuildOptions(
            source=HuggingFaceSource(str(tmp_path / "bare")), out=tmp_path / "b", quiet=True, plugins=False
        )
    )
    assert res.manifest["model"]["config"]["output"] == "pooler_output"
    assert res.manifest["outputs"][0]["shape"] == [-1, 32]
    assert res.manifest["outputs"][0]["name"] == "pooler_output"  # what clients see in the model's metadata
    assert "labels" not in res.manifest
    assert any("no classification head: the build serves its pooler_output" in n for n in res.notes)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_bare_vit_msn_and_dinov2_with_registers_serve_what_their_backbones_return(tmp_path) -> None:
    """Dinov2WithRegistersModel pools its class token (the registers sit between it and the patches);
    ViTMSNModel has no pooler, so its last hidden state is served. The registers' position table is used
    as is at the size it was made for, so the TorchScript exporter has no antialiased resampling to trace."""
    from veo_edge.models.huggingface import load

    tf = transformers
    torch.manual_seed(0)
    cfg = tf.Dinov2WithRegistersConfig(image_size=32, patch_size=8, **SMALL, num_register_tokens=4)
    tf.Dinov2WithRegistersModel(cfg).save_pretrained(tmp_path / "reg")
    tf.BitImageProcessorPil(**CROP).save_pretrained(tmp_path / "reg")
    tf.ViTMSNModel(tf.ViTMSNConfig(image_size=32, patch_size=8, **SMALL)).save_pretrained(tmp_path / "msn")
    tf.ViTImageProcessorPil(**SQUARE).save_pretrained(tmp_path / "msn")
    x = torch.randn(2, 3, 32, 32)
    reg, msn = load(str(tmp_path / "reg")), load(str(tmp_path / "msn"))
    assert (reg.output, reg.preprocess.processor) == ("pooler_output", "BitImageProcessor")
    assert (msn.output, msn.preprocess.processor) == ("last_hidden_state", "ViTImageProcessor")
    with torch.no_grad():
        hidden = reg.module.model(pixel_values=x).last_hidden_state
        assert hidden.shape == (2, 1 + 4 + 16, 32)
        torch.testing.assert_close(reg.module(x), hidden[:, 0])
        assert msn.module(x).shape == (2, 1 + 16, 32)
        traced = torch.jit.trace(reg.module, x[:1])
    torch.testing.assert_close(traced(x), reg.module(x))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("family", ["dinov2", "dinov2_with_registers"])
def test_dinov2_pretrained_at_another_size_builds_at_its_processors_size(family, tmp_path) -> None:
    """Hub DINOv2 checkpoints record the size they were pretrained at (``image_size`` 518) while their
    processors crop to 224, and transformers resamples the position table to each picture: the build takes
    the processor's size, the table resampled once by transformers' own code, and answers as transformers
    does at that size (with registers too, whose antialiased resampling the TorchScript exporter cannot
    translate)."""
    import onnxruntime as ort

    from veo_edge.models.huggingface import load

    tf = transformers
    torch.manual_seed(0)
    cls, config = {
        "dinov2": (tf.Dinov2ForImageClassification, tf.Dinov2Config),
        "dinov2_with_registers": (tf.Dinov2WithRegistersForImageClassification, tf.Dinov2WithRegistersConfig),
    }[family]
    ckpt = tmp_path / family
    cls(config(**{**IMAGE, "image_size": 64}, **SMALL)).save_pretrained(ckpt)  # an 8x8 table of 8x8 patches
    tf.BitImageProcessorPil(**CROP).save_pretrained(ckpt)  # 32x32 pictures: 4x4 patches
    res = run_build(
        BuildOptions(source=HuggingFaceSource(str(ckpt)), out=tmp_path / "b", quiet=True, plugins=False)
    )
    assert res.manifest["input_shape"] == [3, 32, 32]
    assert any(
        f"{family} was pretrained at 64x64" in n and "32x32 pictures (4x4 patches)" in n for n in res.notes
    )
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = cls.from_pretrained(ckpt).eval()(pixel_values=x).logits.numpy()  # transformers, untraced
    session = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(got, want, atol=1e-4)
    # a picture the patches do not tile is refused in one line
    tf.BitImageProcessorPil(
        size={"shortest_edge": 36}, crop_size={"height": 36, "width": 36}
    ).save_pretrained(ckpt)
    with pytest.raises(
        ModelLoadError, match=r"makes 36x36 pictures but the model takes 64x64 \(its 8x8 patches"
    ):
        load(str(ckpt))


def test_bad_checkpoints_are_one_line_errors(tmp_path) -> None:
    tf = transformers
    with pytest.raises(ModelLoadError, match="no such directory"):
        HuggingFaceSource(str(tmp_path / "nowhere")).load()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"without config\.json; expected a directory written by"):
        HuggingFaceSource(str(tmp_path / "empty")).load()
    # an architecture veo-edge does not build: the error lists the supported ones
    tf.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(
        tmp_path / "bert"
    )
    with pytest.raises(
        ModelLoadError, match=r"a 'bert' model, which veo-edge does not build; supported: vit, deit"
    ):
        HuggingFaceSource(str(tmp_path / "bert")).load()
    # a checkpoint saved without its processor
    tf.ViTForImageClassification(tf.ViTConfig(image_size=32, patch_size=8, **SMALL)).save_pretrained(
        tmp_path / "np"
    )
    with pytest.raises(ModelLoadError, match=r"has no processor config \(preprocessor_config.json"):
        HuggingFaceSource(str(tmp_path / "np")).load()
    # a processor whose pictures do not fit the model
    tf.ViTImageProcessorPil(size={"height": 48, "width": 48}).save_pretrained(tmp_path / "np")
    with pytest.raises(ModelLoadError, match="the processor makes 48x48 pictures but the model takes 32x32"):
        HuggingFaceSource(str(tmp_path / "np")).load()


def test_a_hub_id_outside_the_cache_says_how_to_provide_the_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match=r"not in the local Hugging Face cache .* pass --hf DIR"):
        HuggingFaceSource("google/vit-base-patch16-224").load()


def test_half_precision_checkpoints_load_in_float32_and_missing_weights_are_refused(tmp_path) -> None:
    """transformers 5 loads weights in their saved dtype: an fp16 checkpoint exported an fp16 graph no
    input could reach and a bf16 one failed in the exporter; both load in float32 and answer as the
    float32 model does. A weight the checkpoint lacks (a head on a base checkpoint, a deleted tensor)
    would be random: refused, named."""
    from veo_edge.models.huggingface import load

    tf = transformers
    x = torch.randn(2, 3, 32, 32)
    reference = save_checkpoint("vit", tmp_path / "fp32")
    with torch.no_grad():
        want = tf.ViTForImageClassification.from_pretrained(reference).eval()(pixel_values=x).logits
    for dtype in (torch.float16, torch.bfloat16):
        ckpt = tmp_path / str(dtype).split(".")[-1]
        tf.ViTForImageClassification.from_pretrained(reference).to(dtype).save_pretrained(ckpt)
        tf.AutoImageProcessor.from_pretrained(reference).save_pretrained(ckpt)
        hf = load(str(ckpt))
        assert {p.dtype for p in hf.module.parameters()} == {torch.float32}, dtype
        with torch.no_grad():
            torch.testing.assert_close(hf.module(x), want, atol=0.05, rtol=0.05)  # the weights' rounding
    # a base checkpoint whose config names a classification head
    base = tmp_path / "base"
    tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, **SMALL)).save_pretrained(base)
    tf.AutoImageProcessor.from_pretrained(reference).save_pretrained(base)
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "architectures": ["ViTForImageClassification"]}))
    with pytest.raises(ModelLoadError, match=r"lacks 2 of ViTForImageClassification's weights \(classifier"):
        load(str(base))

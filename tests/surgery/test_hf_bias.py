"""Attention with an additive bias fuses into VeoAttention version 2: Hugging Face BEiT (a relative position
bias per layer, or one shared by all layers), Data2Vec-vision and Swin (windows, unshifted then shifted with
its mask), tiny random configs built in memory (nothing downloaded), exported by both exporters with eager
and SDPA attention. Every attention layer is fused, the injected graph computes what PyTorch does, and a
bias that depends on the input is refused with the reason.

The bias tables are given seeded random values, as a trained model has: transformers initialises them to
zero, and an all-zero bias is no bias (it would fuse as version 1 and prove nothing here). Dynamo exports
take seconds each: the cases of FAST cover each structure once, and the others are marked slow, which
``-m "not slow"`` leaves out of a quick local run (``make test`` and CI run them all)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

transformers = pytest.importorskip("transformers", reason="transformers is not installed (dev extra)")
torch = pytest.importorskip("torch")

from veo_edge.export.parity import TorchReference  # noqa: E402
from veo_edge.surgery.inject import PluginInjection  # noqa: E402
from veo_edge.surgery.stage import reference_check  # noqa: E402

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
IMAGE = {"image_size": 32, "patch_size": 8, "num_labels": 5}
#: family -> the bias table each attention layer gets: (B, H, S, S); BEiT: 16 patches + cls
TABLES = {
    "beit": [(1, 2, 17, 17)] * 2,
    "beit-shared": [(1, 2, 17, 17)] * 2,
    "data2vec-vision": [(1, 2, 17, 17)] * 2,
    "swin": [(1, 2, 16, 16), (4, 2, 16, 16)],  # 4x4 windows of an 8x8 grid; block 1 shifted: 4 masks
}
#: the cases run by default, one per structure the exporters emit: the scale as a Mul (eager), a Div
#: (Data2Vec) or on Q and K (SDPA); a table per layer or shared; Swin's window masks expanded to the batch
#: of windows (dynamo; TorchScript's, read off shapes, are built by test_veo_edge_build_onnx_fuses_swin_windows).
#: The other combinations (dynamo's Where-built mask among them) run under slow.
FAST = {
    ("beit", "torchscript", "eager"),
    ("beit-shared", "torchscript", "sdpa"),
    ("data2vec-vision", "torchscript", "eager"),
    ("swin", "dynamo", "sdpa"),
}


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


def hf_model(family: str, attn: str) -> torch.nn.Module:
    tf = transformers
    if family == "swin":
        cfg = tf.SwinConfig(
            image_size=32, patch_size=4, embed_dim=16, depths=[2], num_heads=[2], window_size=4, num_labels=5
        )
    elif family == "data2vec-vision":
        cfg = tf.Data2VecVisionConfig(**IMAGE, **SMALL, use_relative_position_bias=True)
    else:
        shared = family == "beit-shared"
        cfg = tf.BeitConfig(
            **IMAGE, **SMALL, use_relative_position_bias=not shared, use_shared_relative_position_bias=shared
        )
    torch.manual_seed(0)
    model = tf.AutoModelForImageClassification.from_config(cfg, attn_implementation=attn)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.normal_(0.0, 0.5)
    return Logits(model).eval()


@pytest.fixture(scope="module")
def hf_export(tmp_path_factory: pytest.TempPathFactory):
    """``hf_export(family, exporter, attn, opset) -> (onnx path, module)``, each exported once."""
    from veo_edge.export.onnx_export import OnnxExport

    cache: dict[tuple, tuple[Path, torch.nn.Module]] = {}
    root = tmp_path_factory.mktemp("hf-bias")

    def _export(family: str, exporter: str, attn: str, opset: int):
        key = (family, exporter, attn, opset)
        if key not in cache:
            net = hf_model(family, attn)
            path = root / f"{family}-{exporter}-{attn}-{opset}.onnx"
            OnnxExport(opset=opset, exporter=exporter, max_batch=3)(net, (3, 32, 32), path)
            cache[key] = (path, net)
        return cache[key]

    return _export


def _case(family: str, exporter: str, attn: str, opset: int = 0):
    slow = (family, exporter, attn) not in FAST or opset == 23
    opset = opset or (18 if exporter == "dynamo" else 17)
    return pytest.param(
        family,
        exporter,
        attn,
        opset,
        id=f"{family}-{exporter}{opset}-{attn}",
        marks=[pytest.mark.slow] if slow else [],
    )


CASES = [_case(f, e, a) for e in ("torchscript", "dynamo") for f in TABLES for a in ("eager", "sdpa")] + [
    _case(f, "dynamo", "sdpa", 23) for f in ("beit", "swin")
]  # SDPA as the ONNX Attention op


@pytest.mark.parametrize("family, exporter, attn, opset", CASES)
def test_every_biased_attention_layer_fuses_and_matches_pytorch(family, exporter, attn, opset, hf_export):
    path, net = hf_export(family, exporter, attn, opset)
    model = onnx.load(str(path))
    if opset == 23:
        assert "Attention" in {n.op_type for n in model.graph.node}
    inj = PluginInjection((3, 32, 32))(model)
    counts = inj.report.counts()
    assert counts["VeoAttention"] == {"candidates": 2, "matched": 2, "replaced": 2}, inj.report.lines()
    nodes = [n for n in inj.plugin_model.graph.node if n.op_type == "VeoAttention"]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in inj.plugin_model.graph.initializer}
    tables = [inits[n.input[1]] for n in nodes]
    for n in nodes:  # version 2, fed the bias as a constant table
        version = next(a.s for a in n.attribute if a.name == "plugin_version")
        assert version == b"2" and len(n.input) == 2
    assert sorted(t.shape for t in tables) == sorted(TABLES[family])
    assert all(np.isfinite(t).all() and t.dtype == np.float32 for t in tables)
    if family == "beit-shared":  # one table, read by both layers
        assert nodes[0].input[1] == nodes[1].input[1]
    elif family != "swin":
        assert not np.array_equal(tables[0], tables[1])  # a table per layer
    else:  # the shifted block: windows that straddle the shift mask (-100) what the unshifted do not
        shifted = next(t for t in tables if t.shape[0] == 4)
        assert (shifted < -50).any() and not np.array_equal(shifted[0], shifted[3])
    for r in inj.report.regions:
        assert r.max_abs <= r.tolerance, r
    checks = reference_check(
        inj.reference_model,
        _plain(path),
        TorchReference(net),
        (3, 32, 32),
        (1, 3),
        seed=11,
    )
    assert [c["batch"] for c in checks] == [1, 3] and all(c["passed"] for c in checks), checks


def _plain(path: Path):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda x: sess.run(None, {name: x})[0].astype(np.float64)


def test_veo_edge_build_onnx_fuses_swin_windows(hf_export, tmp_path):
    """The CLI end to end on Swin (an unshifted and a shifted window block): built, proven, reported."""
    import json

    from test_stage import veo

    path, _ = hf_export("swin", "torchscript", "sdpa", 17)
    out = tmp_path / "swin"
    r = veo("build", "--onnx", str(path), "--out", str(out), "--max-batch", "3", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "surgery_report.json").read_text())
    attention = report["families"]["attention"]
    assert (attention["fused"], attention["candidates"], attention["left_alone"]) == (2, 2, [])
    assert sorted(r["attrs"]["bias"] for r in report["regions"] if r["op"] == "VeoAttention") == [
        [1, 2, 16, 16],
        [4, 2, 16, 16],
    ]
    assert [c["batch"] for c in report["reference_check"]] == [1, 3]
    assert all(c["passed"] for c in report["reference_check"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert "plugins_onnx" in manifest["artifacts"]
    plugins = onnx.load(str(out / "model.plugins.onnx"))
    assert [n.op_type for n in plugins.graph.node].count("VeoAttention") == 2


class GatedBias(torch.nn.Module):
    """A relative-position-like table scaled by a gate computed from the tokens: a bias that depends on
    the input's values, which VeoAttention's constant bias cannot carry."""

    def __init__(self, dim: int = 32, heads: int = 2, tokens: int = 16) -> None:
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.embed = torch.nn.Conv2d(3, dim, 8, 8)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.table = torch.nn.Parameter(torch.randn(heads, tokens, tokens))
        self.gate = torch.nn.Linear(dim, 1)
        self.head = torch.nn.Linear(dim, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        gate = torch.sigmoid(self.gate(x.mean(1)))[:, :, None, None]  # (N, 1, 1, 1), from the input
        scores = (q @ k.transpose(-2, -1)) * self.d**-0.5 + self.table * gate
        return self.head((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c).mean(1))


def test_a_bias_that_depends_on_the_input_is_refused_with_the_reason(tmp_path):
    from veo_edge.export.onnx_export import OnnxExport

    torch.manual_seed(0)
    path = OnnxExport()(GatedBias().eval(), (3, 32, 32), tmp_path / "gated.onnx")
    report = PluginInjection((3, 32, 32))(onnx.load(str(path))).report
    (region,) = [r for r in report.regions if r.op == "VeoAttention"]
    assert (region.replaced, region.check) == (False, "input_bias")
    assert "depends on the input's values, not on constants and shapes only" in region.detail
    (left,) = report.families()["attention"]["left_alone"]
    assert left["check"] == "input_bias" and "VeoAttention v2 takes a constant bias only" in left["why"]

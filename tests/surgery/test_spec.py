"""The spec loader: both specs load, defaults and bounds apply, nodes carry what TensorRT's importer reads."""

from __future__ import annotations

import json

import pytest

from veo_edge.surgery.spec import SpecError, attention_spec, load_spec, patch_embed_spec


def test_both_specs_load_with_their_attributes_and_io():
    att, pe = attention_spec(), patch_embed_spec()
    assert (att.name, att.version, att.namespace, att.domain) == ("VeoAttention", "2", "veo", "trt.plugins")
    assert att.versions == ("1", "2") and pe.versions == ("1",)
    assert [a.name for a in att.attributes] == ["num_heads", "head_dim", "scale"]
    assert [t.name for t in att.inputs_of("1")] == ["qkv"]
    assert [(t.name, t.optional) for t in att.inputs_of("2")] == [("qkv", False), ("bias", True)]
    assert [t.name for t in pe.inputs][:3] == ["x", "weight", "bias"]
    assert [t.name for t in pe.outputs] == ["tokens", "tokens_ln"]
    assert pe.attr("num_prefix_tokens").max == 2


def test_defaults_are_written_out_and_plugin_fields_added():
    attrs = attention_spec().node_attrs(num_heads=3, head_dim=64)
    assert attrs == {
        "num_heads": 3,
        "head_dim": 64,
        "scale": 0.0,
        "plugin_version": "2",
        "plugin_namespace": "veo",
    }
    assert attention_spec().node_attrs(version="1", num_heads=3, head_dim=64)["plugin_version"] == "1"


def test_a_node_takes_the_inputs_of_its_version():
    att = attention_spec()
    node = att.make_onnx_node(["qkv", "bias"], ["out"], version="2", num_heads=2, head_dim=8)
    assert list(node.input) == ["qkv", "bias"]
    with pytest.raises(SpecError, match=r"VeoAttention version 1 takes 1\.\.1 inputs \(qkv\), got 2"):
        att.make_onnx_node(["qkv", "bias"], ["out"], version="1", num_heads=2, head_dim=8)
    with pytest.raises(SpecError, match=r"VeoAttention has no version '3'; the spec .* lists: 1, 2"):
        att.make_onnx_node(["qkv"], ["out"], version="3", num_heads=2, head_dim=8)


def test_node_has_the_domain_and_plugin_attributes():
    node = patch_embed_spec().make_onnx_node(
        ["x", "w", "b"],
        ["t"],
        patch_size=[16, 16],
        in_channels=3,
        embed_dim=192,
        has_pos_embed=0,
        has_layernorm=0,
    )
    assert node.domain == "trt.plugins" and node.op_type == "VeoPatchEmbedLayerNorm"
    got = {a.name: a for a in node.attribute}
    assert got["plugin_version"].s == b"1" and got["plugin_namespace"].s == b"veo"
    assert list(got["patch_size"].ints) == [16, 16]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"head_dim": 64}, "VeoAttention needs attribute 'num_heads'"),
        ({"num_heads": 0, "head_dim": 64}, r"num_heads=0 is out of range; the spec allows 1\.\.inf"),
        ({"num_heads": 2, "head_dim": 64, "heads": 2}, "VeoAttention has no attribute"),
        ({"num_heads": "two", "head_dim": 64}, "must be of type int, got 'two'"),
    ],
)
def test_bad_attributes_are_refused_with_the_reason(kwargs, message):
    with pytest.raises(SpecError, match=message):
        attention_spec().resolve_attrs(**kwargs)


def test_prefix_tokens_above_the_spec_maximum_are_refused():
    with pytest.raises(SpecError, match=r"num_prefix_tokens=3 is out of range; the spec allows 0\.\.2"):
        patch_embed_spec().resolve_attrs(patch_size=[8, 8], in_channels=3, embed_dim=8, num_prefix_tokens=3)


def test_malformed_and_missing_specs_say_what_is_wrong(tmp_path):
    with pytest.raises(SpecError, match="unknown plugin op 'VeoMlp'"):
        load_spec("VeoMlp")
    with pytest.raises(SpecError, match="does not exist"):
        load_spec("VeoAttention", tmp_path)
    (tmp_path / "veoAttention").mkdir()
    (tmp_path / "veoAttention" / "spec.json").write_text(json.dumps({"name": "VeoAttention"}))
    with pytest.raises(SpecError, match="lacks the 'version' field"):
        load_spec("VeoAttention", tmp_path)

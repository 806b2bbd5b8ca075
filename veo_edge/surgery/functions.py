"""ONNX-function bodies of the plugin ops: each op's decomposition into standard ONNX ops.

Attached to a copy of the injected graph they make it runnable in ONNX Runtime (which inlines
model-local functions), which proves the injected graph computes what the plain one did. The artifact
for TensorRT never carries them: older TensorRT parsers import a local function in preference to a
registered plugin.

``VeoAttention``'s body is generic (its attributes are read through attribute references). Its two
versions are two bodies: model-local functions are keyed by (domain, name, overload), so the version-2
body is the overload ``v2`` and :func:`mark_overloads` stamps the version-2 nodes of a reference copy with
it (IR version 10); version-1 nodes and their body stay as they always were. The
``VeoPatchEmbedLayerNorm`` node's inputs depend on its flags (absent optional inputs are omitted, so they
shift position) and on the length of its position table, so its body is made for one node's layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from veo_edge.surgery.spec import attention_spec, patch_embed_spec

if TYPE_CHECKING:
    import onnx

PLUGIN_ATTRS = ("plugin_version", "plugin_namespace")


def _const_ints(name: str, values: list[int]):
    import onnx

    return onnx.helper.make_node(
        "Constant",
        [],
        [name],
        value=onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [len(values)], values),
    )


def _ref_attr(node_type: str, output: str, attr: str, ref: str, attr_type: int):
    import onnx

    node = onnx.helper.make_node(node_type, [], [output])
    a = onnx.AttributeProto()
    a.name, a.ref_attr_name, a.type = attr, ref, attr_type
    node.attribute.append(a)
    return node


#: the function overload of each VeoAttention version ("" for the version-1 body)
ATTENTION_OVERLOADS = {"1": "", "2": "v2"}
#: the IR version that has function overloads
OVERLOAD_IR_VERSION = 10
F32_LOWEST = -3.4028234663852886e38  # np.finfo(np.float32).min, without importing numpy here


def attention_function(opset: int, version: str = "1") -> onnx.FunctionProto:
    """``VeoAttention``: qkv (N, S, 3*H*D) [, bias (B, 1|H, S, S)] -> (N, S, H*D)."""
    import onnx
    from onnx import helper as h

    A = onnx.AttributeProto
    spec = attention_spec()
    inputs = [t.name for t in spec.inputs_of(version)]
    nodes = [
        _ref_attr("Constant", "heads", "value_int", "num_heads", A.INT),
        _ref_attr("Constant", "hdim", "value_int", "head_dim", A.INT),
        _ref_attr("Constant", "scale_attr", "value_float", "scale", A.FLOAT),
        _const_ints("axes0", [0]),
        _const_ints("prefix", [0, 0, 3]),
        _const_ints("merged", [0, 0, -1]),
        h.make_node("Unsqueeze", ["heads", "axes0"], ["heads1"]),
        h.make_node("Unsqueeze", ["hdim", "axes0"], ["hdim1"]),
        h.make_node("Concat", ["prefix", "heads1", "hdim1"], ["split_shape"], axis=0),
        h.make_node("Reshape", ["qkv", "split_shape"], ["qkv5"]),  # (N, S, 3, H, D)
        h.make_node("Transpose", ["qkv5"], ["heads5"], perm=[2, 0, 3, 1, 4]),  # (3, N, H, S, D)
        h.make_node("Constant", [], ["i0"], value_int=0),
        h.make_node("Constant", [], ["i1"], value_int=1),
        h.make_node("Constant", [], ["i2"], value_int=2),
        h.make_node("Gather", ["heads5", "i0"], ["q"], axis=0),
        h.make_node("Gather", ["heads5", "i1"], ["k"], axis=0),
        h.make_node("Gather", ["heads5", "i2"], ["v"], axis=0),
        h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        # scale = attribute, or 1/sqrt(head_dim) where the attribute is 0
        h.make_node("Cast", ["hdim"], ["hdim_f"], to=onnx.TensorProto.FLOAT),
        h.make_node("Sqrt", ["hdim_f"], ["sqrt_d"]),
        h.make_node("Reciprocal", ["sqrt_d"], ["default_scale"]),
        h.make_node("Constant", [], ["zero"], value_float=0.0),
        h.make_node("Equal", ["scale_attr", "zero"], ["is_default"]),
        h.make_node("Where", ["is_default", "default_scale", "scale_attr"], ["scale_f"]),
        h.make_node("CastLike", ["scale_f", "qkv"], ["scale_t"]),
        h.make_node("MatMul", ["q", "kt"], ["scores"]),
        h.make_node("Mul", ["scores", "scale_t"], ["logits"]),
    ]
    probs_in = "logits"
    if "bias" in inputs:
        nodes += _bias_nodes("logits", "bias", "biased")
        probs_in = "biased"
    nodes += [
        h.make_node("Softmax", [probs_in], ["probs"], axis=-1),
        h.make_node("MatMul", ["probs", "v"], ["ctx"]),  # (N, H, S, D)
        h.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["ctx_t", "merged"], ["out"]),
    ]
    fn = h.make_function(
        spec.domain,
        spec.name,
        inputs,
        ["out"],
        nodes,
        [h.make_opsetid("", opset)],
        attributes=[a.name for a in spec.attributes] + list(PLUGIN_ATTRS),
    )
    if ATTENTION_OVERLOADS[version]:
        fn.overload = ATTENTION_OVERLOADS[version]
    return fn


def _bias_nodes(logits: str, bias: str, out: str) -> list:
    """``logits`` (N, H, S, S) + ``bias`` (B, 1|H, S, S), batch n reading bias row n mod B: the logits
    are viewed as (N/B, B, H, S, S). The bias is clamped to its type's lowest finite value first (-inf
    masks; float16's is -65504, where float32's lowest would round to -inf), the sum too, so a row
    whose every key is masked stays finite and never turns into NaN."""
    from onnx import helper as h

    return [
        h.make_node("Constant", [], ["f32_lowest"], value_float=F32_LOWEST),
        h.make_node("Constant", [], ["f16_lowest"], value_float=-65504.0),
        h.make_node("CastLike", ["f32_lowest", bias], ["lowest_as_t"]),
        h.make_node("IsInf", ["lowest_as_t"], ["narrow_t"]),
        h.make_node("CastLike", ["f16_lowest", bias], ["f16_lowest_t"]),
        h.make_node("Where", ["narrow_t", "f16_lowest_t", "lowest_as_t"], ["lowest"]),
        h.make_node("Max", [bias, "lowest"], ["bias_c"]),
        h.make_node("Shape", [bias], ["bias_b"], start=0, end=1),
        h.make_node("Shape", [logits], ["logits_shape"]),
        h.make_node("Shape", [logits], ["logits_rest"], start=1),
        _const_ints("minus1", [-1]),
        h.make_node("Concat", ["minus1", "bias_b", "logits_rest"], ["grouped"], axis=0),
        h.make_node("Reshape", [logits, "grouped"], ["logits5"]),  # (N/B, B, H, S, S)
        h.make_node("Unsqueeze", ["bias_c", "axes0"], ["bias5"]),  # (1, B, Hb, S, S)
        h.make_node("CastLike", ["bias5", logits], ["bias5_t"]),
        h.make_node("Add", ["logits5", "bias5_t"], ["sum5"]),
        h.make_node("CastLike", ["lowest", logits], ["lowest_l"]),
        h.make_node("Max", ["sum5", "lowest_l"], ["sum5_c"]),
        h.make_node("Reshape", ["sum5_c", "logits_shape"], [out]),
    ]


def mark_overloads(model: onnx.ModelProto) -> bool:
    """Stamp each ``VeoAttention`` node of ``model`` with its version's function overload; True when any
    node needs one (the model then needs IR version 10)."""
    spec = attention_spec()
    marked = False
    for node in model.graph.node:
        if node.op_type != spec.name or node.domain != spec.domain:
            continue
        version = next((a.s.decode() for a in node.attribute if a.name == "plugin_version"), spec.version)
        node.overload = ATTENTION_OVERLOADS.get(version, "")
        marked = marked or bool(node.overload)
    return marked


@dataclass(frozen=True)
class PatchEmbedLayout:
    """What a ``VeoPatchEmbedLayerNorm`` node's inputs are: which optional ones are present, and whether
    its position table covers the patch tokens only ("patches") or prefix + patches ("all")."""

    num_prefix_tokens: int
    has_pos_embed: bool
    pos_covers: str  # "patches" | "all" | "" (no table)
    has_layernorm: bool

    def input_names(self) -> list[str]:
        names = ["x", "weight", "bias"]
        names += ["prefix_tokens"] if self.num_prefix_tokens else []
        names += ["pos_embed"] if self.has_pos_embed else []
        names += ["ln_weight", "ln_bias"] if self.has_layernorm else []
        return names

    def output_names(self) -> list[str]:
        return ["tokens", "tokens_ln"] if self.has_layernorm else ["tokens"]


def patch_embed_function(layout: PatchEmbedLayout, opset: int) -> onnx.FunctionProto:
    """``VeoPatchEmbedLayerNorm`` for one input layout."""
    import onnx
    from onnx import helper as h

    A = onnx.AttributeProto
    spec = patch_embed_spec()
    conv = h.make_node("Conv", ["x", "weight", "bias"], ["conv"])
    for attr in ("kernel_shape", "strides"):
        a = A()
        a.name, a.ref_attr_name, a.type = attr, "patch_size", A.INTS
        conv.attribute.append(a)
    nodes = [
        conv,
        _const_ints("flat_shape", [0, 0, -1]),
        h.make_node("Reshape", ["conv", "flat_shape"], ["flat"]),  # (N, E, L)
        h.make_node("Transpose", ["flat"], ["t0"], perm=[0, 2, 1]),  # (N, L, E)
    ]
    cur = "t0"
    if layout.has_pos_embed and layout.pos_covers == "patches":
        nodes.append(h.make_node("Add", [cur, "pos_embed"], ["t_pos"]))
        cur = "t_pos"
    if layout.num_prefix_tokens:
        nodes += [
            h.make_node("Shape", [cur], ["tok_shape"], start=0, end=1),
            _const_ints("ones", [1, 1]),
            h.make_node("Concat", ["tok_shape", "ones"], ["prefix_shape"], axis=0),
            h.make_node("Expand", ["prefix_tokens", "prefix_shape"], ["prefix"]),
            h.make_node("Concat", ["prefix", cur], ["t_cat"], axis=1),
        ]
        cur = "t_cat"
    if layout.has_pos_embed and layout.pos_covers == "all":
        nodes.append(h.make_node("Add", [cur, "pos_embed"], ["t_pos_all"]))
        cur = "t_pos_all"
    nodes.append(h.make_node("Identity", [cur], ["tokens"]))
    if layout.has_layernorm:
        ln = h.make_node("LayerNormalization", ["tokens", "ln_weight", "ln_bias"], ["tokens_ln"], axis=-1)
        a = A()
        a.name, a.ref_attr_name, a.type = "epsilon", "epsilon", A.FLOAT
        ln.attribute.append(a)
        nodes.append(ln)
    return h.make_function(
        spec.domain,
        spec.name,
        layout.input_names(),
        layout.output_names(),
        nodes,
        [h.make_opsetid("", max(opset, 17))],
        attributes=[a.name for a in spec.attributes] + list(PLUGIN_ATTRS),
    )


def op_model(node: onnx.NodeProto, function: onnx.FunctionProto, inputs: dict, opset: int) -> onnx.ModelProto:
    """A one-node model running ``node`` through its function body; ``inputs`` maps each node input name
    to an example array (float32 ones become graph inputs with a dynamic batch for ``x``/``qkv``)."""
    import onnx
    from onnx import helper as h

    graph_inputs = []
    for name in node.input:
        arr = inputs[name]
        graph_inputs.append(
            h.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)
        )
    node.overload = function.overload
    graph = h.make_graph([node], "op", graph_inputs, [onnx.ValueInfoProto(name=o) for o in node.output])
    return h.make_model(
        graph,
        opset_imports=[h.make_opsetid("", opset), h.make_opsetid(function.domain, 1)],
        functions=[function],
        ir_version=OVERLOAD_IR_VERSION if function.overload else 9,
    )

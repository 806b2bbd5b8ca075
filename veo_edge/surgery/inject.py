"""Plugin injection: the plain ONNX -> the graph TensorRT builds from, plus its runnable reference copy.

The plain ONNX is canonicalized first (folded, no-op nodes and always-zero masks removed, shapes
inferred at the build's static dims); matching, the numeric checks and the injected graphs all work on
that canonical graph, which keeps the dynamic batch axis.

    inj = PluginInjection(input_shape=(3, 224, 224))(onnx.load("model.onnx"))
    inj.plugin_model      # plugin nodes, no function bodies (for TensorRT)
    inj.reference_model   # the same with the ops' ONNX-function bodies (runs in ONNX Runtime)
    inj.report            # what matched, what was replaced, and why not elsewhere
    inj.canonical         # the canonical graph the regions were found in (see surgery.canonical)
    inj.without({3: ("whole_graph", "why")})  # the same, with region 3 of the report left alone

One seeded run of the plain model records the activations at every candidate region's boundary; a region
is replaced only when its structure matched, it computes the op on those activations, and nothing
outside it uses its intermediate results.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from veo_edge.surgery import attention, patch_embed
from veo_edge.surgery.canonical import Canonical, Canonicalize
from veo_edge.surgery.functions import (
    OVERLOAD_IR_VERSION,
    attention_function,
    mark_overloads,
    op_model,
    patch_embed_function,
)
from veo_edge.surgery.graphutil import MatchFailure
from veo_edge.surgery.report import RegionReport, SurgeryReport
from veo_edge.surgery.spec import attention_spec, patch_embed_spec

if TYPE_CHECKING:
    import onnx

REGION_SEED = 4321


@dataclass
class Injection:
    plugin_model: onnx.ModelProto
    reference_model: onnx.ModelProto
    report: SurgeryReport
    canonical: Canonical | None = None
    _session: _Session | None = None

    def without(self, dropped: dict[int, tuple[str, str]]) -> Injection:
        """The same injection with the regions at these indices of ``report.regions`` left alone, each
        reported with its (check, detail)."""
        if self._session is None:
            raise ValueError("this injection was not made by PluginInjection")
        return self._session.assemble(dropped)


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)


@dataclass(frozen=True)
class PluginInjection:
    """Inject both plugin ops into an ONNX ViT with one image or video input of ``input_shape``
    (without the batch axis). The model is canonicalized first (see :mod:`veo_edge.surgery.canonical`);
    the injected graph is the canonical one with the regions replaced."""

    input_shape: tuple[int, ...]
    batch: int = 2
    seed: int = REGION_SEED
    canonicalize: bool = True  # False matches the graph as exported (how veo-edge 0.1 did)

    def __call__(self, model: onnx.ModelProto) -> Injection:
        canon = Canonicalize(self.input_shape, enabled=self.canonicalize)(model)
        return _Session(self, model, canon).assemble({})


class _Session:
    """One canonical graph, its seeded activations and the ops' baselines; assembles injections."""

    def __init__(self, opts: PluginInjection, original: onnx.ModelProto, canon: Canonical) -> None:
        self.opts = opts
        self.original = original
        self.canon = canon
        self.opset = default_opset(original)
        self.values: dict[str, np.ndarray] | None = None
        self.baselines = _Baselines(self.opset)

    def _graph(self) -> Any:
        import onnx_graphsurgeon as gs

        graph = gs.import_onnx(self.canon.model)
        for t in graph.tensors().values():
            if t.__class__.__name__ == "Variable" and t.name in self.canon.shapes:
                t.shape = ["batch" if d is None else d for d in self.canon.shapes[t.name]]
        return graph

    def assemble(self, dropped: dict[int, tuple[str, str]]) -> Injection:
        import onnx
        import onnx_graphsurgeon as gs

        graph = self._graph()
        report = SurgeryReport(seed=self.opts.seed)
        report.canonical = {
            "nodes_before": len(self.original.graph.node),
            "nodes_after": len(self.canon.model.graph.node),
            "removed": dict(self.canon.removed),
        }
        found: list[tuple[Any, Any, RegionReport, int]] = []  # (module, match, report entry, index)
        for mod, op in ((patch_embed, patch_embed.OP), (attention, attention.OP)):
            for anchor in mod.anchors(graph):
                entry = RegionReport(
                    op=op, anchor_op=anchor.op, anchor=anchor.name, replaced=False, matched=False
                )
                report.regions.append(entry)
                try:
                    found.append((mod, mod.match(graph, anchor), entry, len(report.regions) - 1))
                    entry.matched = True
                except MatchFailure as f:
                    entry.check, entry.detail = f.check, f.detail
        if self.values is None:
            self.values = self._record([t for mod, m, _, _ in found for t in mod.wanted(m)])
        values = self.values
        layouts = set()
        versions: set[str] = set()
        index = {attention.OP: 0, patch_embed.OP: 0}
        for mod, m, entry, i in found:
            try:
                err, tol = mod.verify(
                    m, values, self.baselines.attention if mod is attention else self.baselines.patch_embed
                )
                entry.max_abs, entry.tolerance = err, tol
                if mod is patch_embed and layouts and m.layout not in layouts:
                    raise MatchFailure("one_layout", "a second patch embedding with another input layout")
                mod.contained(graph, m)
                if i in dropped:
                    raise MatchFailure(*dropped[i])
            except MatchFailure as f:
                entry.check, entry.detail = f.check, f.detail
                continue
            if mod is patch_embed:
                layouts.add(m.layout)
            node = mod.replace(graph, m, index[entry.op])
            if mod is attention:
                versions.add(node.attrs["plugin_version"])
            index[entry.op] += 1
            entry.replaced = True
            entry.attrs = mod.describe(m)
        graph.cleanup().toposort()
        model = self.original
        plugin_model = gs.export_onnx(graph, do_type_check=False)
        plugin_model.ir_version = model.ir_version
        del plugin_model.opset_import[:]
        plugin_model.opset_import.extend(model.opset_import)
        domain = attention_spec().domain
        if report.replaced and not any(o.domain == domain for o in plugin_model.opset_import):
            plugin_model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
        plugin_model.producer_name = model.producer_name
        plugin_model.producer_version = model.producer_version
        reference_model = copy.deepcopy(plugin_model)
        functions = [attention_function(self.opset, v) for v in sorted(versions)]
        if layouts:
            functions.append(patch_embed_function(next(iter(layouts)), self.opset))
        reference_model.functions.extend(functions)
        overloaded = mark_overloads(reference_model)
        reference_model.ir_version = max(reference_model.ir_version, OVERLOAD_IR_VERSION if overloaded else 8)
        return Injection(plugin_model, reference_model, report, self.canon, self)

    def _record(self, tensors: list[Any]) -> dict[str, np.ndarray]:
        """Run the canonical model once on a seeded input and return the values of ``tensors``."""
        import onnx
        import onnxruntime as ort

        from veo_edge.export.parity import seeded_inputs

        model = self.canon.model
        input_name = model.graph.input[0].name
        feeds = {input_name: seeded_inputs(self.opts.input_shape, self.opts.batch, self.opts.seed)}
        names = [n for n in dict.fromkeys(t.name for t in tensors) if n != input_name]
        if not names:
            return feeds
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        existing = {o.name for o in probe.graph.output}
        probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in existing)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        out = dict(zip(names, sess.run(names, feeds), strict=True))
        return {**out, **feeds}


class _Baselines:
    """The ops' float32 outputs from their function bodies in ONNX Runtime: the yardstick of how far a
    float32 computation of the op lies from the float64 reference."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self._sessions: dict[Any, Any] = {}

    def _run(self, key: Any, build: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import onnxruntime as ort

        if key not in self._sessions:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            self._sessions[key] = ort.InferenceSession(
                build().SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
        return self._sessions[key].run(None, feeds)

    def attention(
        self, qkv: np.ndarray, num_heads: int, head_dim: int, scale: float, bias: np.ndarray | None = None
    ) -> np.ndarray:
        feeds = {"qkv": np.ascontiguousarray(qkv, dtype=np.float32)}
        version = "1"
        if bias is not None:
            feeds["bias"], version = np.ascontiguousarray(bias, dtype=np.float32), "2"
        node = attention_spec().make_onnx_node(
            list(feeds), ["out"], version=version, num_heads=num_heads, head_dim=head_dim, scale=scale
        )
        key = ("attention", num_heads, head_dim, scale, *(a.shape for a in feeds.values()))
        return self._run(
            key, lambda: op_model(node, attention_function(self.opset, version), feeds, self.opset), feeds
        )[0]

    def patch_embed(self, m: Any, x: np.ndarray) -> list[np.ndarray]:
        lay = m.layout
        arrays = [x, m.weight, m.bias]
        arrays += [m.prefix] if m.prefix is not None else []
        arrays += [m.pos] if m.pos is not None else []
        arrays += [m.ln_weight, m.ln_bias] if m.ln is not None else []
        feeds = {
            n: np.ascontiguousarray(a, dtype=np.float32)
            for n, a in zip(lay.input_names(), arrays, strict=True)
        }
        node = patch_embed_spec().make_onnx_node(lay.input_names(), lay.output_names(), **m.attrs())
        key = ("patch_embed", id(m))
        fn = patch_embed_function(lay, self.opset)
        return self._run(key, lambda: op_model(node, fn, feeds, max(self.opset, 17)), feeds)

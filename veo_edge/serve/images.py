"""Encoded pictures over KServe v2: a ``BYTES`` tensor of JPEG/PNG/WebP/BMP files in place of the f32 one.

A build whose manifest records its preprocessing (``build --hf``, vit-digits) takes, under its input's
name, a ``BYTES`` tensor of shape ``[N]`` or ``[N, 1]``: one encoded picture per element, of any size,
each decoded (:func:`veo_edge.preprocess.decode.decode_image`: bombs, truncated files and non-pictures
refused) and preprocessed exactly as the checkpoint's processor does (:class:`~veo_edge.preprocess.Preprocess`).
For metadata-driven tools (perf_analyzer ``--input-data``), the repository also lists a companion model
``<name>_image`` whose one input is declared ``BYTES [-1, 1]`` (Triton config: ``dims [1]``, the model's
``max_batch_size``, the limit its requests are held to); it answers what ``<name>`` answers.

On the wire the elements are Triton's BYTES serialization (each a 4-byte little-endian length, then the
bytes) in binary data or gRPC raw contents, ``bytes_contents`` over gRPC, or base64 strings in JSON
``data`` (as KServe's image examples send them). One picture sent raw, without the length prefix, is
taken as it is (a ``curl --data-binary`` of the file needs no framing); a JPEG, PNG, WebP or BMP cannot
start with a prefix that matches its own length.

Parsing is pure (the protocol parsers call :func:`parse_http_pictures` / :func:`parse_grpc_pictures`);
decoding and preprocessing run in :class:`ImageModels`, on a thread pool (Pillow and numpy release the
GIL), every picture of a request in parallel, off the event loop, while the runtime's thread runs the
batches of earlier requests. The time they take is reported as Triton's ``compute_input``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

import numpy as np

from veo_edge.errors import InputError
from veo_edge.serve.health import PICTURES_SUFFIX
from veo_edge.serve.protocol.spec import ModelSpec, ProtocolError, TensorSpec, expect

#: the companion model of ``name``: the same model with a ``BYTES [-1, 1]`` input (defined beside the
#: healthcheck, which sends its canary tensor to ``name`` for a companion, and imports less)
SUFFIX = PICTURES_SUFFIX
#: decode threads (each picture is decoded and preprocessed on one)
WORKERS = min(8, os.cpu_count() or 1)


# -- parsing (pure) ------------------------------------------------------------------------------
def _check(spec: TensorSpec, model: ModelSpec, datatype: str, shape: Any) -> int:
    """The number of pictures, after checking that ``model`` takes them and the shape is [N] or [N, 1]."""
    name = spec.name
    if datatype != "BYTES":
        raise ProtocolError(
            f"input {name!r} has datatype {datatype!r}, expected BYTES (encoded pictures); model "
            f"{model.name.removesuffix(SUFFIX)!r} takes FP32 tensors"
        )
    prep = model.preprocess
    if prep is None:
        raise ProtocolError(
            f"input {name!r} has datatype 'BYTES', expected {spec.datatype}: model {model.name!r} was built "
            f"without preprocessing, so it takes only {spec.describe()}, not encoded pictures; send the "
            "tensor, or build with --hf so that the build records the checkpoint's preprocessing"
        )
    if prep.num_frames is not None:
        raise ProtocolError(
            f"input {name!r} is BYTES, but model {model.name!r} is a video model ({prep.num_frames} frames a "
            f"clip) and takes only {spec.describe()}; decode the clip (veo-edge infer --video) and send the tensor"
        )
    ok = (
        isinstance(shape, list)
        and len(shape) in (1, 2)
        and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        and (len(shape) == 1 or shape[1] == 1)
    )
    if not ok:
        raise ProtocolError(
            f"input {name!r} is BYTES of shape {shape}; expected [N] or [N, 1]: one encoded picture per element"
        )
    if not 1 <= shape[0] <= model.max_batch:
        raise ProtocolError(
            f"input {name!r} has {shape[0]} pictures, expected 1..{model.max_batch} (the model's max batch "
            "size); split the request"
        )
    return shape[0]


def split_elements(buf: bytes | memoryview, count: int, what: str) -> list[bytes]:
    """Triton's BYTES serialization -> ``count`` elements; one picture without the prefix is itself."""
    buf = memoryview(buf)
    if count == 1 and (len(buf) < 4 or int.from_bytes(buf[:4], "little") != len(buf) - 4):
        return [bytes(buf)]
    out, pos = [], 0
    while pos < len(buf):
        if pos + 4 > len(buf):
            raise ProtocolError(f"{what}: element {len(out)} has a cut 4-byte length prefix")
        n = int.from_bytes(buf[pos : pos + 4], "little")
        if pos + 4 + n > len(buf):
            raise ProtocolError(
                f"{what}: element {len(out)} says {n} bytes, only {len(buf) - pos - 4} follow; each element "
                "is a 4-byte little-endian length, then that many bytes"
            )
        out.append(bytes(buf[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    if len(out) != count:
        raise ProtocolError(f"{what}: {len(out)} elements for a shape of {count}")
    return out


def _objects(elements: list[bytes]) -> np.ndarray:
    arr = np.empty(len(elements), dtype=object)
    arr[:] = elements
    return arr


def parse_http_pictures(
    item: dict[str, Any], spec: TensorSpec, model: ModelSpec, tail: memoryview, offset: int
) -> tuple[np.ndarray, int]:
    """One BYTES input of an HTTP request -> (object array of encoded pictures, new binary offset)."""
    name = spec.name
    count = _check(spec, model, item.get("datatype"), item.get("shape"))
    params = item.get("parameters") or {}
    size = expect(params, dict, f"input {name!r} 'parameters'").get("binary_data_size")
    if size is not None:
        if "data" in item:
            raise ProtocolError(f"input {name!r} has both 'data' and binary_data_size; send one")
        expect(size, int, f"input {name!r} binary_data_size")
        if size < 0 or offset + size > len(tail):
            raise ProtocolError(
                f"binary data is truncated: input {name!r} needs bytes {offset}..{offset + size} after the "
                f"JSON header, the body has {len(tail)}"
            )
        elements = split_elements(tail[offset : offset + size], count, f"input {name!r}")
        return _objects(elements), offset + size
    data = item.get("data")
    if not isinstance(data, list):
        raise ProtocolError(
            f"input {name!r} has neither binary_data_size nor 'data' (a list of base64 strings, one per picture)"
        )
    flat = [d for row in data for d in row] if data and isinstance(data[0], list) else data
    if len(flat) != count:
        raise ProtocolError(
            f"input {name!r} 'data' must be {count} base64 strings (one per picture), got {len(flat)} items"
        )
    kinds = sorted({type(d).__name__ for d in flat if not isinstance(d, str)})
    if kinds:
        raise ProtocolError(
            f"input {name!r} 'data' must hold base64 strings (one per picture), got {', '.join(kinds)}; "
            "base64-encode each picture file"
        )
    elements = []
    for i, text in enumerate(flat):
        try:
            elements.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError) as e:
            raise ProtocolError(
                f"input {name!r} data[{i}] is not base64 ({e}); base64-encode each file"
            ) from e
    return _objects(elements), offset


def parse_grpc_pictures(tensor: Any, raw: bytes | None, spec: TensorSpec, model: ModelSpec) -> np.ndarray:
    """One BYTES input of a ``ModelInferRequest`` (raw contents, or ``contents.bytes_contents``)."""
    count = _check(spec, model, tensor.datatype, list(tensor.shape))
    if raw is not None:
        return _objects(split_elements(raw, count, f"input {spec.name!r}"))
    values = list(tensor.contents.bytes_contents)
    if len(values) != count:
        raise ProtocolError(
            f"input {spec.name!r} has {len(values)} values in contents.bytes_contents, its shape needs {count}"
        )
    return _objects(values)


# -- decoding and the companion models -----------------------------------------------------------
def _picture(prep: Any, data: bytes, what: str) -> np.ndarray:
    from veo_edge.preprocess.decode import decode_image

    return prep(decode_image(data, what))


def takes_pictures(spec: ModelSpec) -> bool:
    return spec.preprocess is not None and spec.preprocess.num_frames is None and len(spec.inputs) == 1


def companion_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` taking one encoded picture per sample: ``BYTES [-1, 1]``, batched up to its max batch."""
    name = spec.inputs[0].name
    return replace(spec, name=spec.name + SUFFIX, inputs=(TensorSpec(name, "BYTES", (-1, 1)),))


class ImageModels:
    """An inference service (one model, or a :class:`~veo_edge.serve.repository.ModelSet`) that decodes
    encoded pictures before inference and lists a ``<name>_image`` companion per model that takes them.
    Everything else is the wrapped service's."""

    def __init__(self, service: Any, workers: int = WORKERS) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.inner = service
        names = list(getattr(service, "names", None) or [service.model.name])
        self.companions = {
            n + SUFFIX: n for n in names if takes_pictures(service.model_spec(n)) and n + SUFFIX not in names
        }
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="veo-edge-decode")
        #: model name -> [requests with pictures, ns spent decoding and preprocessing them]
        self.decode_ns: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    @property
    def draining(self) -> bool:
        return self.inner.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.inner.draining = value

    def _base(self, name: str) -> str:
        return self.companions.get(name, name)

    def rejected(self, name: str | None, protocol: str, status: int, reason: str = "INVALID") -> None:
        """Count a request to model ``name`` refused before inference (unparsable, a bad shared-memory
        region, an undecodable picture, over a limit, unauthorized; ``REJECTED``: over
        --max-buffered-bytes) in the model's own counters (its /metrics, a model set too):
        ``nv_inference_request_failure{reason}`` and ``veo_edge_infer_requests{protocol,code}``. One
        refused before a model of the server was known (``name`` None: the message did not decode; or
        an unknown model) counts in the server's ``veo_edge_infer_requests`` under model ""."""
        base = self._base(name) if name is not None else None
        if hasattr(self.inner, "services"):  # a model set: the model's own service
            one = self.inner.services.get(base)
        else:
            one = self.inner if base == self.inner.model.name else None
        if one is None:
            self.inner.counters.infer_unrouted[(protocol, status)] += 1
            return
        one.counters.infer_rejected[reason] += 1
        one.counters.infer_requests[(protocol, status)] += 1

    def _inner(self, call: Any, name: str, *args: Any) -> Any:
        """``call(base name, *args)`` on the wrapped service; its 404 for an unknown model also names the
        companions (the wrapped service lists only the models it has)."""
        try:
            return call(self._base(name), *args)
        except ProtocolError as e:
            if e.status != 404 or not self.companions or not str(e).startswith("unknown model"):
                raise
            extra = ", ".join(f"{c!r} (encoded pictures)" for c in sorted(self.companions))
            raise ProtocolError(f"{e}; and {extra}", 404) from e

    async def close(self) -> None:
        await self.inner.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- per model ------------------------------------------------------------------------------
    def model_spec(self, name: str, version: str | None = None) -> ModelSpec:
        spec = self._inner(self.inner.model_spec, name, version)
        return companion_spec(spec) if name in self.companions else spec

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        meta = self._inner(self.inner.model_metadata, name, version)
        if name in self.companions:
            meta = {**meta, "name": name, "inputs": [t.to_metadata() for t in self.model_spec(name).inputs]}
        return meta

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        config = self._inner(self.inner.model_config, name, version)
        if name in self.companions:
            # the model's own batching (max_batch_size, dynamic_batching, outputs): what the server takes,
            # 1..max_batch_size pictures a request; dims [1], one picture a sample, with reshape [] saying
            # that [N] is taken too (Triton's way to declare a batch of scalars)
            spec = self.model_spec(name)
            entry = {
                "name": spec.inputs[0].name,
                "data_type": "TYPE_STRING",
                "format": "FORMAT_NONE",
                "dims": list(spec.inputs[0].shape[1:]),
                "reshape": {"shape": []},
            }
            config = {**config, "name": name, "input": [entry]}
            config["instance_group"] = [{**g, "name": name} for g in config.get("instance_group", [])]
        return config

    def model_readiness(self, name: str, version: str | None = None) -> dict[str, Any]:
        return self._inner(self.inner.model_readiness, name, version)

    def model_labels(self, name: str) -> list[str] | None:
        return self.inner.model_labels(self._base(name))

    def canary_body(
        self, name: str, version: str | None = None, binary: bool = False
    ) -> tuple[bytes, int | None]:
        return self.inner.canary_body(self._base(name), version, binary)

    def expect(self, name: str) -> Any:
        return self.inner.expect(self._base(name))

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """The wrapped statistics; a companion reports its model's, with the decode time as compute_input."""
        if name is not None:
            stats = self.inner.statistics(self._base(name), version)
            if name not in self.companions:
                return stats
            return {"model_stats": [self._decode_stats(s, name) for s in stats["model_stats"]]}
        stats = self.inner.statistics()
        entries = list(stats["model_stats"])
        for companion, base in self.companions.items():
            entries += [self._decode_stats(s, companion) for s in entries if s["name"] == base]
        return {"model_stats": entries}

    def _decode_stats(self, entry: dict[str, Any], name: str) -> dict[str, Any]:
        """``entry`` renamed, with the pictures' decode time as ``compute_input``: its count is every
        request's (Triton counts each stage once a request; perf_analyzer requires them equal), its
        time the pictures'."""
        ns = self.decode_ns[self._base(name)][1]
        stages = entry["inference_stats"]
        inference = {**stages, "compute_input": {"count": stages["compute_infer"]["count"], "ns": ns}}
        return {**entry, "name": name, "inference_stats": inference}

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        entries = self.inner.repository_index(ready_only)
        extra = [{**e, "name": c} for c, b in self.companions.items() for e in entries if e["name"] == b]
        return entries + extra

    async def load_model(self, name: str) -> None:
        self._not_companion(name, "load")
        await self.inner.load_model(name)

    async def unload_model(self, name: str) -> None:
        self._not_companion(name, "unload")
        await self.inner.unload_model(name)

    def _not_companion(self, name: str, action: str) -> None:
        if name in self.companions:
            raise ProtocolError(
                f"cannot {action} {name!r}: it is {self.companions[name]!r} taking encoded pictures; "
                f"{action} {self.companions[name]!r}",
                400,
            )

    # -- inference ------------------------------------------------------------------------------
    async def infer(
        self, name: str, version: str | None, request: Any, arrival: Any = None, protocol: str = "http"
    ) -> Any:
        base = self._base(name)
        encoded = [k for k, v in request.inputs.items() if v.dtype == object]
        if encoded:
            spec = self.inner.model_spec(base, version)
            start = time.perf_counter_ns()
            try:
                for key in encoded:
                    request.inputs[key] = await self._decode(spec, key, request.inputs[key])
            except ProtocolError as e:
                self.rejected(base, protocol, e.status)
                raise
            stat = self.decode_ns[base]
            stat[0] += 1
            stat[1] += time.perf_counter_ns() - start
        return await self.inner.infer(base, version if name == base else None, request, arrival, protocol)

    async def _decode(self, spec: ModelSpec, key: str, pictures: np.ndarray) -> np.ndarray:
        """Every picture of one input decoded and preprocessed at once on the pool; (N, C, H, W) f32."""
        loop = asyncio.get_running_loop()
        prep = spec.preprocess
        jobs = [
            loop.run_in_executor(self._pool, _picture, prep, data, f"input {key!r} picture {i}")
            for i, data in enumerate(pictures)
        ]
        try:
            arrays = await asyncio.gather(*jobs)
        except InputError as e:
            raise ProtocolError(str(e), 400) from e
        want = next(s.shape[1:] for s in spec.inputs if s.name == key)
        for i, a in enumerate(arrays):
            if a.shape != tuple(want):
                raise ProtocolError(
                    f"input {key!r} picture {i} preprocesses to {list(a.shape)}, model {spec.name!r} takes "
                    f"{list(want)}: its preprocessing has no fixed size (no centre crop); send pictures of "
                    "the model's aspect ratio"
                )
        return np.stack(arrays)

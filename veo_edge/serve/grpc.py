"""KServe v2 gRPC: the Open Inference Protocol's ``inference.GRPCInferenceService`` on a grpcio asyncio server.

The service stubs are the ones ``tritonclient[grpc]`` ships (``service_pb2`` / ``service_pb2_grpc``), so
``tritonclient.grpc`` and ``perf_analyzer -i grpc`` work unchanged. This module only translates: every
RPC calls the transport-independent methods of the inference service (readiness, metadata, config,
statistics, infer) that the HTTP front end calls too; the classification extension (``classification`` on
a requested output) answers BYTES ``"value:index[:label]"`` as over HTTP. A :class:`~veo_edge.serve.protocol.ProtocolError`
becomes the gRPC status of its HTTP status (404 -> NOT_FOUND, 400 -> INVALID_ARGUMENT, 503 ->
UNAVAILABLE, ...) with its message as the details.

Implemented: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelConfig,
ModelStatistics and ModelInfer (``raw_input_contents`` / ``raw_output_contents``, or the typed
``contents`` fields; shared-memory tensors), and in :mod:`veo_edge.serve.grpc_extensions` the repository
and shared-memory RPCs and the access policy. Trace, log and streaming RPCs answer UNIMPLEMENTED.
ModelInfer reads ``raw_input_contents`` where they arrived (:mod:`veo_edge.serve.grpc_wire`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from veo_edge.serve.bodies import BodyBudget, HttpError
from veo_edge.serve.control import AccessPolicy
from veo_edge.serve.grpc_extensions import ExtensionsServicer, read_infer, status_code
from veo_edge.serve.protocol import (
    DATATYPES,
    InferRequest,
    ModelSpec,
    ProtocolError,
    RequestedOutput,
    ShmInput,
    check_inputs,
    check_requested_outputs,
    shm_input,
    shm_ref,
)
from veo_edge.serve.protocol.response import output_bytes, shm_params
from veo_edge.serve.shm import ShmRegistry

log = logging.getLogger("veo_edge.serve.grpc")

#: the typed ``InferTensorContents`` field that carries each datatype (FP16 travels only raw)
CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def _param(p: Any) -> Any:
    """The Python value of one ``InferParameter``."""
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def _version(v: str) -> str | None:
    return v or None


def _fits(spec_shape: tuple[int, ...], shape: list[int]) -> bool:
    return len(shape) == len(spec_shape) and all(
        w < 0 or w == g for w, g in zip(spec_shape, shape, strict=True)
    )


SERVICE = "inference.GRPCInferenceService"


def parse_infer_request(msg: Any, model: ModelSpec, raw: Any = None) -> InferRequest:
    """A checked :class:`InferRequest` from a ``ModelInferRequest`` (and its raw contents, when
    :mod:`veo_edge.serve.grpc_wire` took them out); :class:`ProtocolError` (400) otherwise."""
    specs = {s.name: s for s in model.inputs}
    raw = msg.raw_input_contents if raw is None else raw
    refs = [shm_ref({k: _param(v) for k, v in t.parameters.items()}, f"input {t.name!r}") for t in msg.inputs]
    in_body = sum(ref is None for ref in refs)
    if raw and len(raw) != in_body:
        raise ProtocolError(
            f"the request has {in_body} inputs outside shared memory but {len(raw)} raw_input_contents; "
            "send raw contents for every such input or for none"
        )
    arrays: dict[str, np.ndarray] = {}
    in_shm: dict[str, ShmInput] = {}
    raw_index = 0
    for tensor, ref in zip(msg.inputs, refs, strict=True):
        spec = specs.get(tensor.name)
        if spec is None:
            raise ProtocolError(
                f"unknown input {tensor.name!r}; model {model.name!r} has inputs: "
                f"{'; '.join(s.describe() for s in model.inputs)}"
            )
        if tensor.name in arrays or tensor.name in in_shm:
            raise ProtocolError(f"input {tensor.name!r} is given twice")
        if "BYTES" in (tensor.datatype, spec.datatype):  # encoded pictures: serve/images.py
            from veo_edge.serve.images import parse_grpc_pictures

            if ref is not None:
                raise ProtocolError(f"input {tensor.name!r}: encoded pictures cannot come from shared memory")
            data = raw[raw_index] if raw else None
            raw_index += 1 if raw else 0
            arrays[tensor.name] = parse_grpc_pictures(tensor, data, spec, model)
            continue
        if tensor.datatype != spec.datatype:
            raise ProtocolError(
                f"input {tensor.name!r} has datatype {tensor.datatype!r}, expected {spec.datatype}"
            )
        shape = list(tensor.shape)
        if not _fits(spec.shape, shape) or any(d < 0 for d in shape):
            raise ProtocolError(
                f"input {tensor.name!r} has shape {shape}, expected {spec.describe()} (N is the batch axis, "
                f"1..{model.max_batch})"
            )
        if not 1 <= shape[0] <= model.max_batch:
            raise ProtocolError(
                f"input {tensor.name!r} has batch {shape[0]}, expected 1..{model.max_batch} (the model's max "
                "batch size); split the request"
            )
        if ref is not None:
            if tensor.HasField("contents"):
                raise ProtocolError(
                    f"input {tensor.name!r} is in shared memory and has contents too; send one"
                )
            in_shm[tensor.name] = shm_input(tensor.name, spec.datatype, tuple(shape), ref)
            continue
        dtype = DATATYPES[spec.datatype]
        count = math.prod(shape)
        if raw:
            if tensor.HasField("contents"):  # as Triton: one or the other, never a silent choice
                raise ProtocolError(
                    f"input {tensor.name!r} has typed contents and raw_input_contents too; send one"
                )
            data = raw[raw_index]
            raw_index += 1
            if len(data) != count * dtype.itemsize:
                raise ProtocolError(
                    f"input {tensor.name!r} has {len(data)} bytes of raw contents, its shape {shape} of "
                    f"{spec.datatype} needs {count * dtype.itemsize}"
                )
            arrays[tensor.name] = np.frombuffer(data, dtype=dtype).reshape(shape)
            continue
        field = CONTENTS_FIELDS.get(spec.datatype)
        values = getattr(tensor.contents, field) if field else ()
        if len(values) != count:
            where = f"contents.{field}" if field else "raw_input_contents (FP16 has no typed contents)"
            raise ProtocolError(
                f"input {tensor.name!r} has {len(values)} values in {where}, its shape {shape} needs {count}"
            )
        try:
            with np.errstate(over="raise"):
                arrays[tensor.name] = np.asarray(values).astype(dtype, casting="unsafe").reshape(shape)
        except (OverflowError, FloatingPointError) as e:
            raise ProtocolError(f"input {tensor.name!r} contents do not fit {spec.datatype}: {e}") from e
    batch = check_inputs(model, arrays, in_shm)
    requested: list[RequestedOutput] = []
    for out in msg.outputs:
        params = {k: _param(v) for k, v in out.parameters.items()}
        # the classification extension: tritonclient sends "classification" (class_count in its API)
        count = params.get("classification", params.get("class_count", 0))
        if not isinstance(count, int) or isinstance(count, bool):
            raise ProtocolError(
                f"output {out.name!r} classification must be an integer parameter, got {count!r}"
            )
        requested.append(RequestedOutput(out.name, True, count, shm_ref(params, f"output {out.name!r}")))
    check_requested_outputs(model, requested)  # known, once each, a usable class count
    if not requested:
        requested = [RequestedOutput(s.name, True) for s in model.outputs]
    params = {k: _param(v) for k, v in msg.parameters.items()}
    return InferRequest(arrays, requested, batch, msg.id or None, params, in_shm)


def encode_infer_response(
    model: ModelSpec,
    request: InferRequest,
    outputs: dict[str, np.ndarray],
    labels: list[str] | None = None,
    write_shm: Any = None,
) -> Any:
    """A ``ModelInferResponse`` with the requested outputs in ``raw_output_contents`` (little-endian;
    a classification output as BYTES ``"value:index[:label]"``, serialized as Triton does). An output
    requested in shared memory is written there by ``write_shm`` and answered with its region and size
    (and an empty raw entry, so that the raw contents stay aligned with the outputs)."""
    resp = service_pb2.ModelInferResponse(
        model_name=model.name, model_version=model.version, id=request.id or ""
    )
    for want in request.outputs:
        datatype, shape, data = output_bytes(outputs[want.name], want.class_count, labels)
        tensor = resp.outputs.add(name=want.name, datatype=datatype, shape=shape)
        if want.shm is not None and write_shm is not None:
            write_shm(want.shm, data)
            for key, value in shm_params(want.shm, len(data)).items():
                if isinstance(value, str):
                    tensor.parameters[key].string_param = value
                else:
                    tensor.parameters[key].int64_param = value
            data = b""
        resp.raw_output_contents.append(bytes(data))
    return resp


class InferenceServicer(ExtensionsServicer, service_pb2_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over an inference service (one model or several)."""

    def __init__(
        self, service: Any, shm: ShmRegistry, access: AccessPolicy, budget: BodyBudget | None = None
    ) -> None:
        self.service = service
        self.shm = shm
        self.access = access
        #: the request bytes held across HTTP and gRPC (``--max-buffered-bytes``); None: not bounded here
        self.budget = budget
        #: ModelInfer calls being handled now (the drain waits for them)
        self.in_flight = 0

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=bool(self.service.readiness()["ready"]))

    async def ModelReady(self, request: Any, context: Any) -> Any:
        ready = await self._call(
            context, self.service.model_readiness, request.name, _version(request.version)
        )
        return service_pb2.ModelReadyResponse(ready=bool(ready["ready"]))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        meta = self.service.server_metadata()
        extensions = sorted(meta["extensions"] + self.shm.extensions())
        return service_pb2.ServerMetadataResponse(
            name=meta["name"], version=meta["version"], extensions=extensions
        )

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        meta = await self._call(context, self.service.model_metadata, request.name, _version(request.version))
        return json_format.ParseDict(meta, service_pb2.ModelMetadataResponse(), ignore_unknown_fields=True)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        config = await self._call(context, self.service.model_config, request.name, _version(request.version))
        return service_pb2.ModelConfigResponse(
            config=json_format.ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
        )

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        stats = await self._call(
            context, self.service.statistics, request.name or None, _version(request.version)
        )
        return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # Triton's trace, logging and streaming RPCs: a clear UNIMPLEMENTED (the generated stubs raised
    # NotImplementedError, which grpcio logged as an ERROR with a traceback on every call)
    async def TraceSetting(self, request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "TraceSetting: veo-edge serve has no trace extension"
        )

    async def LogSettings(self, request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "LogSettings: veo-edge serve has no logging extension"
        )

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "ModelStreamInfer: veo-edge serve does not stream; use ModelInfer"
        )

    async def ModelInferOne(self, requests: Any, context: Any) -> Any:
        """ModelInfer as the server registers it: client-streaming, the same on the wire (unary clients
        call it unchanged), so that it runs before its message arrives. grpcio refuses a message over
        --max-request-bytes (``grpc.max_receive_message_length``) before any unary handler, where it was
        counted nowhere; here it reads as no message at all and counts as 413 under model "", as an HTTP
        body over the cap does; a call past its deadline before its message came counts as 499
        (:func:`~veo_edge.serve.grpc_extensions.no_message`, read by
        :func:`~veo_edge.serve.grpc_extensions.read_infer`)."""
        self.in_flight += 1
        try:
            request = await read_infer(context, lambda status: self.service.rejected(None, "grpc", status))
            return await self.ModelInfer(request, context)
        finally:
            self.in_flight -= 1

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        request, raw, size = request if isinstance(request, tuple) else (request, None, 0)
        if request is None:
            self.service.rejected(None, "grpc", 400)  # no model is known from a message that did not decode
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, raw)
        # the message's bytes count against --max-buffered-bytes until it is answered, as a body's do (a
        # cancelled call's until its samples that run are done: serve/outcomes.py)
        try:
            if self.budget is not None:
                self.budget.take(size, 0)
        except HttpError as e:
            self.service.rejected(request.model_name, "grpc", 503, "REJECTED")
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        try:
            return await self._infer(request, raw, context)
        finally:
            if self.budget is not None:
                self.budget.give(size)

    async def _infer(self, request: Any, raw: Any, context: Any) -> Any:
        version = _version(request.model_version)
        arrival = self.service.expect(request.model_name)  # a batch forming now may wait for it
        lease = None
        try:
            try:
                model = self.service.model_spec(request.model_name, version)
                parsed = parse_infer_request(request, model, raw)
                lease = self.shm.attach(parsed)  # shared-memory inputs become arrays; 400 for a bad region
            except ProtocolError as e:
                self.service.rejected(request.model_name, "grpc", e.status)
                raise
            try:
                outputs = await self.service.infer(request.model_name, version, parsed, arrival, "grpc")
            except asyncio.CancelledError:  # the client cancelled or passed its deadline: 499, as HTTP
                self.service.rejected(request.model_name, "grpc", 499, "CANCELED")
                raise
            labels = self.service.model_labels(request.model_name)
            write = lease.write if lease is not None else None
            return encode_infer_response(model, parsed, outputs, labels, write)
        except ProtocolError as e:
            await context.abort(status_code(e), str(e))
        finally:
            if arrival is not None:
                arrival.done()
            if lease is not None:
                lease.release()

"""The gRPC side of the extensions beyond inference: the model repository (index, load, unload), system and
CUDA shared memory, and the access policy (:mod:`veo_edge.serve.control`) as a grpc.aio interceptor.
Each RPC calls what the HTTP routes call, so both transports answer alike.
"""

from __future__ import annotations

from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from veo_edge.serve.control import GRPC_GROUPS, AccessPolicy
from veo_edge.serve.protocol import ProtocolError

#: HTTP status of a ProtocolError -> gRPC status code (as Triton maps them)
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(e: ProtocolError) -> grpc.StatusCode:
    return STATUS_CODES.get(e.status, grpc.StatusCode.UNKNOWN)


#: ModelInfer's answer when no message arrived (grpcio refused it as too large, or none was sent)
NO_MESSAGE = (
    "no ModelInferRequest arrived: it was over the server's --max-request-bytes (refused as it came) or "
    "the client sent none"
)
#: a call whose deadline was at most this far (s) when no message came gave up on its deadline (the
#: client's own timer fires a moment before the server's)
DEADLINE_SLACK_S = 0.1


def no_message(context: Any) -> tuple[int, Any]:
    """What a ModelInfer call that ended with no message counts as, and its status: 499 (the client gave
    up: its deadline had passed, or all but) or 413 (grpcio refused the message as over
    --max-request-bytes). A client that cancels before its message is whole, with no deadline, reads the
    same as the 413 on the server and counts there too."""
    left = context.time_remaining()
    if left is not None and left <= DEADLINE_SLACK_S:
        return 499, grpc.StatusCode.DEADLINE_EXCEEDED
    return 413, grpc.StatusCode.RESOURCE_EXHAUSTED


async def read_infer(context: Any, count: Any) -> Any:
    """ModelInfer's one message (client-streaming, as the server registers it); a call that ended with
    none is counted (``count(status)``, see :func:`no_message`) and aborted."""
    request = await context.read()
    if request is grpc.aio.EOF:
        status, code = no_message(context)
        count(status)
        await context.abort(code, NO_MESSAGE)
    return request


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a call whose group needs the bearer token (``authorization`` metadata) without the right one;
    installed only when some group does, so an open server pays nothing per call."""

    def __init__(self, access: AccessPolicy) -> None:
        self.access = access
        #: (model name, HTTP status) of a refused ModelInfer, to count it (set by the server's start)
        self.refused: Any = None

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        method = details.method.rsplit("/", 1)[-1]
        auth = next((v for k, v in details.invocation_metadata or () if k == "authorization"), None)
        try:
            self.access.check(method, GRPC_GROUPS.get(method), auth)
        except ProtocolError as e:
            code, message, status = status_code(e), str(e), e.status
            handler = await continuation(details)

            async def deny(request: Any, context: Any) -> Any:
                await context.abort(code, message)

            async def deny_infer(requests: Any, context: Any) -> Any:  # ModelInfer: client-streaming
                request = await read_infer(context, lambda s: self.refused and self.refused(None, s))
                if self.refused is not None:
                    message_ = request[0] if isinstance(request, tuple) else request
                    self.refused(getattr(message_, "model_name", None), status)
                await context.abort(code, message)

            if handler is None:
                return handler
            if method == "ModelInfer" and handler.stream_unary is not None:
                return grpc.stream_unary_rpc_method_handler(
                    deny_infer, handler.request_deserializer, handler.response_serializer
                )
            if handler.unary_unary is None:  # streaming RPCs: none is implemented
                return handler
            return grpc.unary_unary_rpc_method_handler(
                deny, handler.request_deserializer, handler.response_serializer
            )
        return await continuation(details)


class ExtensionsServicer:
    """The repository and shared-memory RPCs of ``inference.GRPCInferenceService`` (a mixin of the servicer,
    which sets ``service``, ``shm`` and ``access``)."""

    service: Any
    shm: Any
    access: AccessPolicy

    async def _call(self, context: Any, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ProtocolError as e:
            await context.abort(status_code(e), str(e))

    # -- model repository -------------------------------------------------------------------------
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        models = self.service.repository_index(ready_only=request.ready)
        resp = service_pb2.RepositoryIndexResponse()
        for m in models:
            resp.models.add(name=m["name"], version=m["version"], state=m["state"], reason=m["reason"])
        return resp

    async def _control(self, context: Any, method: str, request: Any) -> None:
        try:
            self.access.check(method, None, None)  # the mode; the token is the interceptor's
            if method == "RepositoryModelLoad" and request.parameters:
                raise ProtocolError(
                    f"load parameters {sorted(request.parameters)} are not supported: this server loads its "
                    "model from the build directory as built; rebuild to change it"
                )
            if method == "RepositoryModelLoad":
                await self.service.load_model(request.model_name)
            else:
                await self.service.unload_model(request.model_name)
        except ProtocolError as e:
            await context.abort(status_code(e), str(e))

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        await self._control(context, "RepositoryModelLoad", request)
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        await self._control(context, "RepositoryModelUnload", request)
        return service_pb2.RepositoryModelUnloadResponse()

    # -- shared memory ------------------------------------------------------------------------------
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        regions = await self._call(context, self.shm.status, "system", request.name or None)
        resp = service_pb2.SystemSharedMemoryStatusResponse()
        for r in regions:
            resp.regions[r["name"]].CopyFrom(service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**r))
        return resp

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._call(
            context, self.shm.register_system, request.name, request.key, request.offset, request.byte_size
        )
        return service_pb2.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._call(context, self.shm.unregister, "system", request.name or None)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        regions = await self._call(context, self.shm.status, "cuda", request.name or None)
        resp = service_pb2.CudaSharedMemoryStatusResponse()
        for r in regions:
            resp.regions[r["name"]].CopyFrom(service_pb2.CudaSharedMemoryStatusResponse.RegionStatus(**r))
        return resp

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._call(
            context,
            self.shm.register_cuda,
            request.name,
            request.raw_handle,
            request.device_id,
            request.byte_size,
        )
        return service_pb2.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._call(context, self.shm.unregister, "cuda", request.name or None)
        return service_pb2.CudaSharedMemoryUnregisterResponse()

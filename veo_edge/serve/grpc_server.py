"""The gRPC front end's lifetime: a grpcio asyncio server bound (a taken port is one clear error),
serving the :class:`~veo_edge.serve.grpc.InferenceServicer` with ModelInfer reading its tensors in place
(:mod:`veo_edge.serve.grpc_wire`), and stopped within a grace."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from veo_edge.errors import UsageError
from veo_edge.serve.bodies import BodyBudget
from veo_edge.serve.control import AccessPolicy
from veo_edge.serve.grpc import SERVICE, InferenceServicer
from veo_edge.serve.grpc_extensions import AccessInterceptor
from veo_edge.serve.grpc_wire import deserialize_or_refuse
from veo_edge.serve.shm import ShmRegistry


class GrpcServer:
    """The gRPC front end's lifetime: bind (a taken port is a UsageError; :meth:`stop` releases it),
    start serving a service, stop (finishing RPCs in flight within a grace)."""

    def __init__(
        self,
        max_message_bytes: int = 64 << 20,
        shm: ShmRegistry | None = None,
        access: AccessPolicy | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.shm = shm or ShmRegistry()
        self.access = access or AccessPolicy()
        self.budget = budget
        self._server: Any = None
        self._servicer: Any = None
        #: ModelInfer calls still in flight when the drain's grace ended (cancelled by the stop)
        self.cut_off = 0

    async def bind(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); returns the bound port. Call on the serving loop."""
        self._interceptor = AccessInterceptor(self.access)
        server = grpc.aio.server(
            interceptors=[self._interceptor] if self.access.restricted else None,
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        self._server = server  # stop() releases it either way, on this loop (not grpcio's finaliser)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as e:
            bound, reason = 0, str(e)
        else:
            reason = "the port is taken or the address is not this machine's"
        if not bound:
            raise UsageError(f"cannot listen for gRPC on {address} ({reason}); choose another --grpc-port")
        self.port = bound
        return bound

    async def start(self, service: Any) -> None:
        """Serve ``service`` (one model or several) on the bound port."""
        self._servicer = InferenceServicer(service, self.shm, self.access, self.budget)
        handlers = _handlers(self._servicer)
        self._interceptor.refused = lambda name, status: service.rejected(
            name, "grpc", status, "UNAUTHORIZED"
        )
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        if hasattr(self._server, "add_registered_method_handlers"):  # grpcio >= 1.63: looked up first
            self._server.add_registered_method_handlers(SERVICE, handlers)
        await self._server.start()

    @property
    def in_flight(self) -> int:
        """ModelInfer calls being handled now."""
        return self._servicer.in_flight if self._servicer is not None else 0

    async def stop(self, grace_s: float | None) -> None:
        """Stop accepting calls, answer those in flight within ``grace_s``, then cancel the rest
        (counted in :attr:`cut_off`, so that the drain does not read as clean)."""
        if self._server is not None:
            server, self._server = self._server, None
            stopping = asyncio.ensure_future(server.stop(grace_s))
            deadline = asyncio.get_running_loop().time() + (grace_s or 0.0)
            while self.in_flight and not stopping.done() and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            self.cut_off = self.in_flight
            await stopping


def _handlers(servicer: Any) -> dict[str, Any]:
    """The generated stubs' method handlers, with ModelInfer reading its tensors in place
    (:mod:`veo_edge.serve.grpc_wire`)."""

    class Capture:  # what the generated registration hands a server
        def __init__(self) -> None:
            self.handlers: dict[str, Any] = {}

        def add_generic_rpc_handlers(self, generic: Any) -> None:
            pass

        def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
            self.handlers = dict(handlers)

    capture = Capture()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, capture)
    handlers = capture.handlers
    # client-streaming (one message, the same wire): see InferenceServicer.ModelInferOne
    handlers["ModelInfer"] = grpc.stream_unary_rpc_method_handler(
        servicer.ModelInferOne,
        request_deserializer=lambda data: (*deserialize_or_refuse(data), len(data)),
        response_serializer=service_pb2.ModelInferResponse.SerializeToString,
    )
    return handlers

"""Which gRPC server library, measured: the KServe v2 service with no model behind it (ModelInfer answers
a fixed 10-float output at once), served by grpcio's asyncio server (what `veo-edge serve` runs), grpcio's
thread-pool server and grpclib (pure-Python HTTP/2 on the event loop: no thread hops, no C core), each on
uvloop where it has a loop, driven by perf_analyzer over gRPC, cells interleaved:

    python bench/grpc_fronts.py --perf-analyzer PATH/perf_analyzer [--elements 10,150528] [--rounds 2]

``--elements``: the input's FP32 elements per request (150528: a 224x224 RGB picture, 602 kB). grpclib
is not a veo-edge dependency: ``pip install grpclib`` for its rows (skipped without it). ``--fronts``
picks fronts, among them grpcio asyncio with grpc core experiments switched (``VARIANTS``), e.g.
``--fronts grpcio-aio,grpcio-aio-iomgr``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path
from typing import NamedTuple

import clients
import harness as h
import report

SERVICE = "inference.GRPCInferenceService"
FRONTS = ("grpcio-aio", "grpcio-threads", "grpclib")


class Variant(NamedTuple):
    """grpcio asyncio again, with grpc core experiments switched (``GRPC_EXPERIMENTS``, read once at
    grpc's init) and/or server options (channel arguments) added."""

    experiments: str | None = None
    options: tuple[tuple[str, int], ...] = ()


#: ``--fronts grpcio-aio,grpcio-aio-iomgr`` asks whether the EventEngine's own I/O threads cost a hop,
#: ``grpcio-aio-h2`` whether a 602 kB request pays for HTTP/2's 16 KiB frames and 64 KiB stream window
#: (the client may send one frame, no window updates), ``grpcio-aio-read`` for 8 KiB socket reads
VARIANTS = {
    "grpcio-aio-iomgr": Variant("-event_engine_listener,-event_engine_for_all_other_endpoints"),
    "grpcio-aio-h2": Variant(options=(("grpc.http2.max_frame_size", (16 << 20) - 1), ("grpc.http2.lookahead_bytes", 16 << 20))),
    "grpcio-aio-read": Variant(options=(("grpc.experimental.tcp_read_chunk_size", 1 << 20), ("grpc.experimental.tcp_min_read_chunk_size", 256 << 10))),
}  # fmt: skip
#: the fronts' C heap keeps freed blocks: with glibc's defaults a front with no model behind it gives
#: the few 602 kB copies of each request back to the kernel and faults ~260 fresh pages in again
#: (+0.35 ms a request, measured), which `veo-edge serve`, whose heap the model's buffers hold up, does
#: not pay (0.0-0.2 page faults a request over HTTP and gRPC); ``--glibc-defaults`` measures with them
HEAP = "glibc.malloc.mmap_threshold=8388608:glibc.malloc.trim_threshold=33554432"


def _methods(elements: int) -> dict:
    """name -> (handler, request class, response class): what perf_analyzer calls."""
    from tritonclient.grpc import model_config_pb2 as mc
    from tritonclient.grpc import service_pb2 as pb

    def metadata(req):
        r = pb.ModelMetadataResponse(name="m", versions=["1"], platform="none")
        r.inputs.add(name="x", datatype="FP32", shape=[-1, elements])
        r.outputs.add(name="y", datatype="FP32", shape=[-1, 10])
        return r

    def config(req):
        c = mc.ModelConfig(name="m", max_batch_size=8)
        c.input.add(name="x", data_type=mc.TYPE_FP32, dims=[elements])
        c.output.add(name="y", data_type=mc.TYPE_FP32, dims=[10])
        return pb.ModelConfigResponse(config=c)

    def infer(req):
        r = pb.ModelInferResponse(model_name="m", model_version="1", id=req.id)
        r.outputs.add(name="y", datatype="FP32", shape=[1, 10])
        r.raw_output_contents.append(bytes(40))
        return r

    return {
        "ServerMetadata": (lambda r: pb.ServerMetadataResponse(name="none", version="1"), pb.ServerMetadataRequest, pb.ServerMetadataResponse),
        "ServerLive": (lambda r: pb.ServerLiveResponse(live=True), pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ModelMetadata": (metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
        "ModelConfig": (config, pb.ModelConfigRequest, pb.ModelConfigResponse),
        "ModelStatistics": (lambda r: pb.ModelStatisticsResponse(), pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
        "ModelInfer": (infer, pb.ModelInferRequest, pb.ModelInferResponse),
    }  # fmt: skip


def serve(front: str, port: int, elements: int) -> None:
    """Serve until killed (the child's side)."""
    import uvloop

    methods = _methods(elements)
    if front.startswith("grpcio"):
        import grpc

        options = [("grpc.max_receive_message_length", 64 << 20), *VARIANTS.get(front, Variant()).options]

        def handlers(wrap):
            return {
                name: grpc.unary_unary_rpc_method_handler(
                    wrap(fn), request_deserializer=rq.FromString, response_serializer=rs.SerializeToString
                )
                for name, (fn, rq, rs) in methods.items()
            }

        if front == "grpcio-threads":
            server = grpc.server(futures.ThreadPoolExecutor(8), options=options)
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(SERVICE, handlers(lambda fn: lambda r, ctx: fn(r))),)
            )
            server.add_insecure_port(f"127.0.0.1:{port}")
            server.start()
            server.wait_for_termination()
            return

        def wrap(fn):
            async def handler(request, context):
                return fn(request)

            return handler

        async def main() -> None:
            server = grpc.aio.server(options=options)
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers(wrap)),))
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            await server.wait_for_termination()

    else:
        from grpclib.const import Cardinality, Handler
        from grpclib.server import Server

        class Service:
            def __mapping__(self):
                def handler(fn):
                    async def unary(stream):
                        await stream.send_message(fn(await stream.recv_message()))

                    return unary

                return {
                    f"/{SERVICE}/{name}": Handler(handler(fn), Cardinality.UNARY_UNARY, rq, rs)
                    for name, (fn, rq, rs) in methods.items()
                }

        async def main() -> None:
            server = Server([Service()])
            await server.start("127.0.0.1", port)
            await server.wait_closed()

    uvloop.install()
    asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--perf-analyzer", required=False, help="Triton's perf_analyzer binary")
    ap.add_argument(
        "--elements", default="10,150528", help="FP32 input elements per request, comma-separated"
    )
    ap.add_argument("--fronts", default=",".join(FRONTS), help=f"of {FRONTS + tuple(VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=2, help="cells interleaved this many times")
    ap.add_argument("--seconds", type=float, default=3.0, help="per cell")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here, as JSON")
    ap.add_argument("--glibc-defaults", action="store_true", help="fronts on glibc's malloc defaults (HEAP)")
    ap.add_argument("--serve", nargs=3, metavar=("FRONT", "PORT", "ELEMENTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve[0], int(args.serve[1]), int(args.serve[2]))
    if not args.perf_analyzer:
        raise SystemExit("--perf-analyzer PATH is required")
    fronts = [f for f in args.fronts.split(",") if f != "grpclib" or importlib.util.find_spec("grpclib")]
    unknown = set(fronts) - set(FRONTS) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown --fronts {sorted(unknown)}; known: {FRONTS + tuple(VARIANTS)}")
    table = report.Table(
        f"gRPC servers, no model, {args.concurrency} client(s), perf_analyzer",
        {
            "front": ("server", "{}"),
            "elements": ("input elements", "{}"),
            "round": ("round", "{}"),
            "rate": ("requests/s", "{:.0f}"),
            "p50": ("p50 ms", "{:.3f}"),
        },
    )
    for elements in map(int, args.elements.split(",")):
        children = {}
        try:
            for front in fronts:
                port = h.free_port()
                cmd = [sys.executable, __file__, "--serve", front, str(port), str(elements)]
                env = dict(os.environ) if args.glibc_defaults else {**os.environ, "GLIBC_TUNABLES": HEAP}
                experiments = VARIANTS.get(front, Variant()).experiments
                if experiments:
                    env["GRPC_EXPERIMENTS"] = experiments
                children[front] = (port, subprocess.Popen(cmd, env=env))
            time.sleep(3)  # imports and bind
            for rnd in range(1, args.rounds + 1):
                for front, (port, _) in children.items():
                    r = clients.perf_analyzer(
                        args.perf_analyzer, "m", port, "grpc", args.concurrency, args.seconds
                    )
                    table.add(front=front, elements=elements, round=rnd, rate=r["rate"], p50=r["p50"])
        finally:
            for _, proc in children.values():
                proc.kill()
                proc.wait()
    report.emit([table], args.json)


if __name__ == "__main__":
    main()

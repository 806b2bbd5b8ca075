"""``veo-edge serve``: an Open Inference Protocol (KServe v2 / Triton) HTTP server for a build."""

from __future__ import annotations

from pathlib import Path

import typer


def serve(
    build_dir: Path = typer.Argument(..., help="A build directory made by `veo-edge build`."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (0.0.0.0 for all interfaces)."),
    port: int = typer.Option(8000, "--port", "-p", help="Port to listen on (0: any free port)."),
    model_name: str = typer.Option(None, "--model-name", help="Name to serve under (default: the build's)."),
    backend: str = typer.Option("auto", "--backend", "-b", help="auto, tensorrt, onnxruntime or openvino."),
    policy: str = typer.Option(
        None,
        "--policy",
        help="Fallback order with --backend auto, comma-separated (e.g. openvino,onnxruntime on a CPU host).",
    ),
    max_request_bytes: int = typer.Option(64 << 20, "--max-request-bytes", help="Largest request body."),
    max_buffered_bytes: int = typer.Option(
        256 << 20, "--max-buffered-bytes", help="Request-body bytes held across all connections (503 above)."
    ),
    max_queue: int = typer.Option(256, "--max-queue", help="Samples queued before requests get 503."),
    max_queue_delay_ms: float = typer.Option(2.0, "--max-queue-delay-ms", help="Batching window."),
    infer_timeout: float = typer.Option(60.0, "--infer-timeout", help="Seconds before an infer gets 504."),
    read_timeout: float = typer.Option(
        30.0, "--read-timeout", help="Seconds a request may take to arrive whole (408 after)."
    ),
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", help="Seconds SIGTERM waits for requests."),
    threads: int = typer.Option(None, "--threads", help="CPU backend threads (default: the backend's)."),
) -> None:
    """Serve a build over HTTP (KServe v2 / Triton protocol, /metrics); SIGTERM drains and exits 0."""
    import logging

    from veo_edge.errors import UsageError
    from veo_edge.runtime.runtime import Runtime
    from veo_edge.serve.app import ServeOptions, serve_async
    from veo_edge.serve.transport import Limits

    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is out of range; expected 0..65535")
    if max_request_bytes < 1024:
        raise UsageError(f"--max-request-bytes {max_request_bytes} is too small; expected at least 1024")
    if max_buffered_bytes < max_request_bytes:
        raise UsageError(
            f"--max-buffered-bytes {max_buffered_bytes} is below --max-request-bytes {max_request_bytes}; "
            "the server could never hold one largest request"
        )
    if read_timeout <= 0:
        raise UsageError(f"--read-timeout {read_timeout} must be positive")
    names = [p.strip() for p in policy.split(",") if p.strip()] if policy is not None else None
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    options = ServeOptions(
        host=host,
        port=port,
        model_name=model_name,
        limits=Limits(
            max_body_bytes=max_request_bytes,
            max_buffered_bytes=max_buffered_bytes,
            read_timeout_s=read_timeout,
        ),
        infer_timeout_s=infer_timeout,
        drain_timeout_s=drain_timeout,
    )

    def make_runtime() -> Runtime:  # also what POST /v2/repository/models/NAME/load calls after an unload
        return Runtime(
            build_dir,
            backend=backend,
            policy=names,
            max_queue=max_queue,
            max_queue_delay_ms=max_queue_delay_ms,
            threads=threads,
        ).start()

    runtime = make_runtime()
    try:
        code = _run(serve_async(runtime, options, make_runtime=make_runtime))
    finally:
        runtime.close(drain=False)
    raise typer.Exit(code)


def _run(coro):
    """Run on uvloop where it is installed (a faster event loop, what uvicorn itself prefers)."""
    import asyncio

    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)

"""``veo-edge serve``: an Open Inference Protocol (KServe v2 / Triton) HTTP server for a build."""

from __future__ import annotations

import os
from pathlib import Path

import typer


def serve(
    build_dirs: list[Path] = typer.Argument(
        ...,
        help="Build directories made by `veo-edge build`, or model repositories (folders of them).",
        metavar="DIR",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (0.0.0.0 for all interfaces)."),
    port: int = typer.Option(8000, "--port", "-p", help="Port to listen on (0: any free port)."),
    model_name: str = typer.Option(None, "--model-name", help="Name to serve under (default: the build's)."),
    backend: str = typer.Option(
        "auto",
        "--backend",
        "-b",
        help="auto, tensorrt, onnxruntime-cuda, openvino or onnxruntime. A GPU backend that cannot run here "
        "falls back to openvino, then onnxruntime, with a warning (--no-fallback: an error instead).",
    ),
    no_fallback: bool = typer.Option(
        False,
        "--no-fallback",
        help="Fail at start (exit 8) instead of falling back from the chosen backend (with auto: from the "
        "policy's first) to a slower one, and never switch backends on a fault (a batch a transient fault "
        "failed is still run once more on the same backend).",
    ),
    policy: str = typer.Option(
        None,
        "--policy",
        help="Fallback order with --backend auto, comma-separated (e.g. openvino,onnxruntime on a CPU host; "
        "auto: the default order).",
    ),
    max_request_bytes: int = typer.Option(64 << 20, "--max-request-bytes", help="Largest request body."),
    max_buffered_bytes: int = typer.Option(
        256 << 20,
        "--max-buffered-bytes",
        help="Request bytes held across all connections, HTTP bodies and gRPC messages (503 / UNAVAILABLE above).",
    ),
    max_queue: int = typer.Option(256, "--max-queue", help="Samples queued before requests get 503."),
    max_queue_delay_ms: float = typer.Option(2.0, "--max-queue-delay-ms", help="Batching window."),
    batch_limit: str = typer.Option(
        "auto",
        "--batch-limit",
        envvar="VEO_EDGE_BATCH_LIMIT",
        metavar="auto|N",
        help="Largest batch run on the backend, up to each build's --max-batch: concurrent requests are "
        "batched up to it, a request with more samples runs in parts. auto: OpenVINO ADAPTIVE measures at "
        "start whether batches run more samples/s than single samples on this CPU, and runs batch 1 where "
        "they do not (1.1x needed; other backends: the build's). 1: no batching, and ADAPTIVE compiles "
        "twice, not three times (docs/serving.md).",
    ),
    lone_max_ms: float = typer.Option(
        50.0,
        "--lone-max-ms",
        help="A lone request runs on the event loop's thread, no hand-off, while the model's lone requests "
        "take at most this many ms (the median of the last 5; 0: never).",
    ),
    recover_interval: str = typer.Option(
        "30s",
        "--recover-interval",
        help="How often, after a fault, to try the backends ahead of the active one again and re-warm a "
        "standby whose warm-up failed (e.g. 30s, 2m; off: never). Runs beside the traffic; a backend "
        "that fails again waits twice as long each time, up to 8 intervals.",
    ),
    infer_timeout: float = typer.Option(60.0, "--infer-timeout", help="Seconds before an infer gets 504."),
    read_timeout: float = typer.Option(
        30.0, "--read-timeout", help="Seconds a request may take to arrive whole (408 after)."
    ),
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", help="Seconds SIGTERM waits for requests."),
    threads: int = typer.Option(
        None, "--threads", min=0, help="CPU backend threads (default, or 0: the backend's)."
    ),
    grpc_port: int = typer.Option(
        8001, "--grpc-port", help="KServe v2 gRPC port (0: any free port; -1: off)."
    ),
    metrics_port: int = typer.Option(
        8002, "--metrics-port", help="Separate Prometheus port (0: any free port; -1: off)."
    ),
    warmup: bool = typer.Option(
        True,
        "--warmup/--no-warmup",
        help="Before serving, run every batch size once on every infer request the batcher can use (the "
        "first batch of each size then runs at full speed, and memory stays at what it reaches here).",
    ),
    shared_memory: bool = typer.Option(
        False,
        "--shared-memory/--no-shared-memory",
        help="Triton's shared-memory extension: clients on this host register /dev/shm regions and pass "
        "tensors through them (off by default: a client that may register can read and write any segment "
        "this server's user can open).",
    ),
    model_control_mode: str = typer.Option(
        "none",
        "--model-control-mode",
        envvar="VEO_EDGE_MODEL_CONTROL_MODE",
        help="none: model load/unload are refused (403); explicit: they are on and need the control token.",
    ),
    control_token_file: Path = typer.Option(
        None,
        "--control-token-file",
        envvar="VEO_EDGE_CONTROL_TOKEN_FILE",
        help="File holding the bearer token for model control and --restrict-api groups (a mounted "
        "secret); or set VEO_EDGE_CONTROL_TOKEN to the token itself.",
    ),
    restrict_api: str = typer.Option(
        None,
        "--restrict-api",
        envvar="VEO_EDGE_RESTRICT_API",
        help="More API groups behind the token, comma-separated: health, metadata, inference, statistics, "
        "shared-memory, model-repository.",
    ),
    performance_hint: str = typer.Option(
        "ADAPTIVE",
        "--performance-hint",
        help="OpenVINO: LATENCY (one request at a time, all cores), THROUGHPUT (streams in parallel) or "
        "ADAPTIVE (LATENCY at batch 1 for a sample that runs alone, streams under concurrent load "
        "and for larger batches, two batches in flight per stream; three compiles in memory, two with "
        "--batch-limit 1 or where auto finds that batches do not pay).",
    ),
) -> None:
    """Serve builds over HTTP and gRPC (KServe v2 / Triton protocol, /metrics); SIGTERM drains, exits 0.

    Several models: several DIRs, or a folder of build directories (each subfolder a model, named by
    its folder); each model has its own runtime, batcher and readiness."""
    import logging
    from collections.abc import Callable

    from veo_edge.errors import UsageError
    from veo_edge.runtime.policy import resolve_policy
    from veo_edge.runtime.runtime import Runtime
    from veo_edge.serve.app import ServeOptions
    from veo_edge.serve.control import load_token, make_policy
    from veo_edge.serve.listen import check_free
    from veo_edge.serve.repository import find_models
    from veo_edge.serve.server import serve_async
    from veo_edge.serve.transport import Limits
    from veo_edge.soak.units import parse_duration

    for flag, value, least in (
        ("--port", port, 0),
        ("--grpc-port", grpc_port, -1),
        ("--metrics-port", metrics_port, -1),
    ):
        if not least <= value <= 65535:
            raise UsageError(f"{flag} {value} is out of range; expected {least}..65535")
    if max_request_bytes < 1024:
        raise UsageError(f"--max-request-bytes {max_request_bytes} is too small; expected at least 1024")
    if max_buffered_bytes < max_request_bytes:
        raise UsageError(
            f"--max-buffered-bytes {max_buffered_bytes} is below --max-request-bytes {max_request_bytes}; "
            "the server could never hold one largest request"
        )
    if read_timeout <= 0:
        raise UsageError(f"--read-timeout {read_timeout} must be positive")
    if lone_max_ms < 0:
        raise UsageError(f"--lone-max-ms {lone_max_ms} must be 0 (never) or more")
    if infer_timeout <= 0:  # 0 would answer every infer 504 at once
        raise UsageError(
            f"--infer-timeout {infer_timeout} must be positive (seconds before an infer gets 504)"
        )
    if drain_timeout < 0:
        raise UsageError(f"--drain-timeout {drain_timeout} must be 0 (no wait) or more")
    if max_queue < 1:  # the runtime checks these too, under its own (Python) names
        raise UsageError(f"--max-queue {max_queue} must be at least 1 (samples queued before a 503)")
    limit = parse_batch_limit(batch_limit)
    if max_queue_delay_ms < 0:
        raise UsageError(f"--max-queue-delay-ms {max_queue_delay_ms} must be 0 (no batching window) or more")
    recover_s = (
        None
        if recover_interval.strip().lower() == "off"
        else parse_duration(recover_interval, "--recover-interval")
    )
    access = make_policy(model_control_mode, load_token(control_token_file), (restrict_api or "").split(","))
    names = [p.strip() for p in policy.split(",") if p.strip()] if policy is not None else None
    # an unknown backend is a usage error before any port is bound
    resolve_policy(backend, names, fallback=not no_fallback)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # the server's own start, readiness and stop lines are INFO (what alerting on WARNING should not
    # see); the libraries' and the runtime's per-batch ones stay at WARNING
    logging.getLogger("veo_edge.serve").setLevel(logging.INFO)
    if os.environ.get("VEO_EDGE_FAULTS"):  # a drill left in a production environment must not go unnoticed
        from veo_edge.runtime.faults import parse_faults
        from veo_edge.runtime.policy import BACKENDS

        parse_faults(None, BACKENDS)  # a malformed one is its one-line error, not a warning and then that
        logging.getLogger("veo_edge.serve").warning(
            "fault injection is on: VEO_EDGE_FAULTS=%s (for tests and drills; unset it to serve)",
            os.environ["VEO_EDGE_FAULTS"],
        )
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
        grpc_port=None if grpc_port < 0 else grpc_port,
        metrics_port=None if metrics_port < 0 else metrics_port,
        warmup=warmup,
        shared_memory=shared_memory,
        access=access,
        lone_max_ms=lone_max_ms,
    )

    def runtime_for(build) -> Callable[[], Runtime]:
        def make() -> Runtime:  # also what POST /v2/repository/models/NAME/load calls after an unload
            return Runtime(
                build,
                backend=backend,
                fallback=not no_fallback,
                policy=names,
                max_queue=max_queue,
                max_queue_delay_ms=max_queue_delay_ms,
                threads=threads,
                performance_hint=performance_hint.upper(),
                recover_interval_s=recover_s,
                max_batch=limit if limit == "auto" else min(limit, build.max_batch),
            ).start()

        return make

    check_free(host, {"--port": port, "--grpc-port": grpc_port, "--metrics-port": metrics_port})
    entries = find_models(build_dirs, model_name)
    for entry in entries:
        if limit != "auto" and limit > entry.build.max_batch:  # a limit the build cannot take: said once
            logging.getLogger("veo_edge.serve").warning(
                "model %r: --batch-limit %d is above the build's max batch %d: batches of %d at most "
                "(rebuild with --max-batch %d for larger ones)",
                entry.name, limit, entry.build.max_batch, entry.build.max_batch, limit,
            )  # fmt: skip
    makers = {entry.name: runtime_for(entry.build) for entry in entries}
    # the ports are bound first (a taken one fails at once), then each model's runtime is made
    raise typer.Exit(_run(serve_async(None, options, make_runtime=makers)))


def parse_batch_limit(value: str) -> int | str:
    """``--batch-limit``: "auto" or a count of at least 1."""
    from veo_edge.errors import UsageError

    text = value.strip().lower()
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--batch-limit {value} must be auto or a count of at least 1 (1: no batching)")
    return int(text)


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

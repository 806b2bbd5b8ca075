"""A SIGTERM that lands as the server starts listening: the drain's line is the last word, with no start
line ("model ...: backend ..., ready", "serving ... on") after it (they came after "draining", so the log
said the server was serving after it had begun to stop). In process, the real service and uvicorn;
the signal is sent from uvicorn's own "Started server process" line, after its signal handlers are in
place and before the server is listening."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path


class _SigtermAtStart(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Started server process"):
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_at_start_logs_no_ready_line_after_draining(nano_build: Path, caplog) -> None:
    from veo_edge.runtime.runtime import Runtime
    from veo_edge.serve.app import ServeOptions
    from veo_edge.serve.server import serve_async

    uvicorn_log = logging.getLogger("uvicorn.error")
    trigger, level = _SigtermAtStart(), uvicorn_log.level
    uvicorn_log.addHandler(trigger)
    uvicorn_log.setLevel(logging.INFO)
    caplog.set_level(logging.INFO, logger="veo_edge.serve")
    ports: list[int] = []
    runtime = Runtime(nano_build, policy=["onnxruntime"]).start()
    options = ServeOptions(port=0, grpc_port=None, metrics_port=None, model_name="vit-nano")
    try:
        code = asyncio.run(serve_async(runtime, options, on_listening=ports.append))
    finally:
        uvicorn_log.removeHandler(trigger)
        uvicorn_log.setLevel(level)
        runtime.close()
    assert code == 0 and len(ports) == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "veo_edge.serve"]
    drain = next(i for i, line in enumerate(lines) if line.startswith("draining:"))
    after = lines[drain + 1 :]
    assert not [line for line in after if "ready" in line or "serving" in line], lines
    assert after[-1].startswith("stopped: answered 0 infer requests; drained cleanly: True"), lines

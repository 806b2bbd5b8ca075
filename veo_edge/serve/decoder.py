"""The worker process that decodes large JSON request heads off the event loop, and that never outlives
the server: killed with SIGKILL (an OOM killer, a supervisor) a server used to leave it and
multiprocessing's resource tracker behind, reparented to init, for good."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

#: how often the worker looks whether its server is still there (the longest it outlives a killed one)
PARENT_POLL_S = 0.5


def _exit_with(parent: int) -> None:
    """In the worker: a daemon thread that ends the process once ``parent`` is gone (reparented)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)  # the server is gone: nobody is left to answer to

    threading.Thread(target=watch, name="veo-edge-parent-watch", daemon=True).start()


def start_decoder() -> ProcessPoolExecutor:
    """The decoding worker, started now (spawned: never fork a process holding backend threads; before
    the gRPC server exists, whose fork handlers would complain). It exits within
    :data:`PARENT_POLL_S` of its server, however the server ended; the resource tracker follows it."""
    import multiprocessing

    pool = ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_exit_with,
        initargs=(os.getpid(),),
    )
    pool.submit(int)
    return pool

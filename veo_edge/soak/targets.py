"""What a soak drives: the runtime in this process (here), or a server over the Open Inference Protocol
(:mod:`veo_edge.soak.servers`).

A target only needs ``open()`` (returns the input shape and dtype of one sample), ``call(batch,
timeout_s)`` (one request within ``timeout_s``; returns normally only for a complete, well-formed
answer, else raises), ``observe()`` (counters and memory of the thing under test, for the sampler) and
``close()``; a server target also has ``alive()`` (``None``, or why its health probe failed). The soak never reaches further in:
in-process it uses the public :class:`~veo_edge.Runtime` API, against a server only URLs (KServe v2 JSON
with the binary tensor extension, ``/metrics``), so a server with another HTTP stack works unchanged,
or its KServe v2 gRPC service (``grpc://HOST:PORT``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.errors import VeoEdgeError


class RequestError(VeoEdgeError):
    """One soak request failed (an error answer, a malformed answer or a broken connection)."""

    kind = "error"


class RequestTimeout(RequestError):
    kind = "timeout"


def check_output(out: np.ndarray, n: int) -> None:
    if out.ndim < 1 or out.shape[0] != n or not np.all(np.isfinite(out)):
        raise RequestError(
            f"malformed answer: output shape {tuple(out.shape)} for a batch of {n}, or not finite"
        )


class InProcessTarget:
    """The runtime in this process; batch 1 goes through the dynamic batcher (``submit``), larger
    batches through ``infer``."""

    kind = "in-process"

    def __init__(
        self,
        build_dir: Path,
        *,
        backend: str = "auto",
        policy: list[str] | None = None,
        faults: Mapping[str, Any] | str | None = None,
        fault_clock: Callable[[], float] | None = None,
        recover_interval_s: float | None = None,
        timeout_s: float = 30.0,
        threads: int | None = None,
    ) -> None:
        self.build_dir = Path(build_dir)
        self.backend = backend
        self.policy = policy
        self.faults = faults
        self.fault_clock = fault_clock
        self.recover_interval_s = recover_interval_s
        self.timeout_s = timeout_s
        self.threads = threads
        self.runtime = None

    def open(self) -> tuple[tuple[int, ...], np.dtype]:
        from veo_edge.runtime.runtime import Runtime

        self.runtime = Runtime(
            self.build_dir,
            backend=self.backend,
            policy=self.policy,
            faults=self.faults,
            fault_clock=self.fault_clock,
            recover_interval_s=self.recover_interval_s,
            threads=self.threads,
        ).start()
        self.runtime.warm_up()  # as `veo-edge serve` does: the run measures the memory serving keeps
        return self.runtime.input_shape, self.runtime.input_dtype

    @property
    def name(self) -> str:
        return str(self.build_dir)

    def call(self, batch: np.ndarray, timeout_s: float | None = None) -> None:
        from concurrent.futures import TimeoutError as FutureTimeout

        rt = self.runtime
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            if batch.shape[0] == 1:
                out = rt.submit(batch[0]).result(timeout=timeout)[None]  # one sample's answer
            else:
                out = rt.infer(batch)
        except FutureTimeout as e:
            raise RequestTimeout(f"no answer within {timeout:.3g} s") from e
        except VeoEdgeError as e:
            raise RequestError(f"{type(e).__name__}: {e}") from e
        check_output(np.asarray(out), batch.shape[0])

    def observe(self) -> dict[str, Any]:
        rt = self.runtime
        stats = rt.stats()
        state = rt.state
        return {
            "fallbacks": stats["fallback_switches"],
            "recoveries": stats.get("fallback_recoveries", 0),
            "batches": stats["batches"],
            "active_backend": stats["active_backend"],
            "pool": stats.get("memory_pool"),
            "switches": state.switches,
            "injected": rt.injected_faults(),
            "faults": stats["faults"],
            "retries": stats["retries"],
        }

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None

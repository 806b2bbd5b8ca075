#!/usr/bin/env python3
"""The kernels' tiny cases launched from cuda-python alone, for compute-sanitizer: no PyTorch, so the
tools instrument our two kernels and not PyTorch's libraries (racecheck under a PyTorch process gave no
result in 95 s on an H200). Correctness is the kernels section's job; this only launches every code path
(plain attention, attention with a bias, patch embedding with and without LayerNorm, FP32 and FP16) and
checks each launch's status and that the outputs are finite.

    compute-sanitizer --tool racecheck python plugins/tests/gpu/sanitizer_driver.py build/plugins-gpu/libveo_kernels.so
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # veo_edge, for the checks' reference
sys.path.insert(0, str(Path(__file__).resolve().parent))
from checks_attention_bias import _bias, bias_cases
from checks_kernels import PatchParams, attention_cases, load, patch_cases


class Device:
    def __init__(self) -> None:
        from cuda.bindings import runtime

        self.rt, self.ptrs = runtime, []

    def check(self, result, what: str):
        err, *rest = result
        if int(getattr(err, "value", err)) != 0:
            raise RuntimeError(f"{what}: {err}")
        return rest[0] if len(rest) == 1 else rest

    def put(self, a: np.ndarray | None) -> int | None:
        if a is None:
            return None
        a = np.ascontiguousarray(a)
        ptr = int(self.check(self.rt.cudaMalloc(a.nbytes), "cudaMalloc"))
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.check(self.rt.cudaMemcpy(ptr, a.ctypes.data, a.nbytes, kind), "copy in")
        self.ptrs.append(ptr)
        return ptr

    def get(self, ptr: int, like: np.ndarray) -> np.ndarray:
        host = np.empty_like(like)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.check(self.rt.cudaMemcpy(host.ctypes.data, ptr, host.nbytes, kind), "copy out")
        return host

    def free(self) -> None:
        for ptr in self.ptrs:
            self.rt.cudaFree(ptr)
        self.ptrs.clear()


def main(lib_path: str) -> int:
    lib = load(Path(lib_path))
    vp, ci = ctypes.c_void_p, ctypes.c_int
    lib.veoAttentionForwardBias.argtypes = [vp, vp, ci, ci, vp, ci, ci, ci, ci, ci, ctypes.c_float, vp]
    dev, rng, launches = Device(), np.random.default_rng(0), 0

    def ran(status: int, out: int, like: np.ndarray, what: str) -> None:
        nonlocal launches
        if status != 0:
            raise RuntimeError(f"{what}: status {status}: {lib.veoKernelLastError().decode()}")
        dev.check(dev.rt.cudaDeviceSynchronize(), what)
        if not np.isfinite(dev.get(out, like).astype(np.float32)).all():
            raise RuntimeError(f"{what}: non-finite output")
        launches += 1

    for dtype, code in ((np.float32, 0), (np.float16, 1)):
        for batch, s, h, d in attention_cases(False, tiny=True):
            qkv = rng.standard_normal((batch, s, 3 * h * d)).astype(dtype)
            out = np.zeros((batch, s, h * d), dtype)
            o = dev.put(out)
            ran(
                lib.veoAttentionForward(dev.put(qkv), o, code, batch, s, h, d, 0.0, None), o, out, "attention"
            )
        for batch, s, h, d, nb, hb in bias_cases(False, tiny=True):
            qkv = rng.standard_normal((batch, s, 3 * h * d)).astype(dtype)
            bias = _bias(rng, (nb, hb, s, s)).astype(dtype)
            out = np.zeros((batch, s, h * d), dtype)
            o = dev.put(out)
            st = lib.veoAttentionForwardBias(
                dev.put(qkv), dev.put(bias), nb, hb, o, code, batch, s, h, d, 0.2, None
            )
            ran(st, o, out, "attention with a bias")
        for _name, xshape, patch, e, p, pos_mode, ln in patch_cases(False, tiny=True):
            batch, c = 2, xshape[0]
            n_patch = int(np.prod([x // q for x, q in zip(xshape[1:], patch, strict=True)]))
            rnd = lambda *shape, dt=dtype: rng.standard_normal(shape).astype(dt)  # noqa: E731
            video = len(patch) == 3
            prm = PatchParams(
                batch, c, e, xshape[1] if video else 1, xshape[-2], xshape[-1], patch[0] if video else 1,
                patch[-2], patch[-1], p, {None: 0, "patches": 1, "all": 2}[pos_mode], int(ln), 1e-6,
            )  # fmt: skip
            tok = np.zeros((batch, p + n_patch, e), dtype)
            t, t_ln = dev.put(tok), dev.put(tok) if ln else None
            pos = rnd(1, n_patch + (p if pos_mode == "all" else 0), e) if pos_mode else None
            args = [rnd(batch, *xshape), rnd(e, c, *patch) * 0.05, rnd(e), rnd(1, p, e) if p else None, pos]
            args += [rnd(e), rnd(e)] if ln else [None, None]
            ptrs = [dev.put(a) for a in args]
            st = lib.veoPatchEmbedLayerNormForward(ctypes.byref(prm), code, *ptrs, t, t_ln, None)
            ran(st, t, tok, "patch embedding")
        dev.free()
    print(f"sanitizer driver: {launches} launches, every status 0 and every output finite")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

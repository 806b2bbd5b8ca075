"""The kernels section of the GPU checks (and the sanitizer's run of it): every case on fresh seeded
random inputs, outputs filled with NaN first (every element must be written), the kernel's max abs error
against ``veo_edge.surgery.reference`` (float64) at most 2x PyTorch's own error (SDPA; conv + LayerNorm)
in the same precision plus a floor (FlashAttention's criterion), both timed with CUDA events.

Run through ``run_gpu_checks.py --sections kernels,sanitizer``; torch is passed in, so this module
imports on a machine without it.
"""

# The ours()/theirs() closures are called within the loop iteration that defines them.
# ruff: noqa: B023

from __future__ import annotations

import ctypes
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from veo_edge.surgery import reference  # noqa: E402

FLOOR = {"float32": 1e-5, "float16": 1e-4}  # relative to max |reference|


class PatchParams(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_int)
        for n in (  # veo_patch_embed_params, in order
            "batch",
            "in_channels",
            "embed_dim",
            "in_t",
            "in_h",
            "in_w",
            "patch_t",
            "patch_h",
            "patch_w",
            "num_prefix_tokens",
            "pos_mode",
            "has_layernorm",
        )
    ] + [("epsilon", ctypes.c_float)]


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    vp, ci = ctypes.c_void_p, ctypes.c_int
    lib.veoAttentionForward.argtypes = [vp, vp, ci, ci, ci, ci, ci, ctypes.c_float, vp]
    lib.veoPatchEmbedLayerNormForward.argtypes = [ctypes.POINTER(PatchParams), ci] + [vp] * 10
    lib.veoKernelLastError.restype = ctypes.c_char_p
    return lib


def timed(torch, fn, reps: int = 20) -> float:
    """Median milliseconds of fn() over reps, with CUDA events, after warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def maxerr(got, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.double().cpu().numpy() - ref)))


def attention_cases(quick: bool, tiny: bool = False):
    if tiny:  # under compute-sanitizer: every code path once, fast
        yield from ((1, 50, 2, 64), (2, 37, 2, 128))
        return
    seqs = [50, 197, 785] if quick else [50, 197, 785, 1569, 3137]
    dims = [48, 64, 80] if quick else [32, 48, 64, 80, 96, 128]
    for batch in (1, 8):
        for s in seqs:
            for d in dims:
                yield batch, s, 2, d


def check_attention(torch, lib, quick: bool, rows: list, tiny: bool = False) -> bool:
    ok = True
    f = torch.nn.functional
    for batch, s, h, d in attention_cases(quick, tiny):
        gen = torch.Generator(device="cuda").manual_seed(batch * 100003 + s * 131 + d)
        base = torch.randn(batch, s, 3 * h * d, device="cuda", generator=gen)
        for dtype_name, dtype, code in (("float32", torch.float32, 0), ("float16", torch.float16, 1)):
            qkv = base.to(dtype)
            items = [0, batch - 1] if batch > 1 else [0]  # the fp64 reference on the first and last item
            ref = np.stack(
                [
                    reference.attention(qkv[i : i + 1].double().cpu().numpy(), num_heads=h, head_dim=d)[0]
                    for i in items
                ]
            )
            out = torch.full((batch, s, h * d), float("nan"), device="cuda", dtype=dtype)
            stream = torch.cuda.current_stream().cuda_stream

            def ours():
                st = lib.veoAttentionForward(
                    qkv.data_ptr(), out.data_ptr(), code, batch, s, h, d, 0.0, stream
                )
                if st != 0:
                    raise RuntimeError(lib.veoKernelLastError().decode())

            def theirs():
                q, k, v = qkv.view(batch, s, 3, h, d).permute(2, 0, 3, 1, 4)
                return f.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, s, h * d)

            ours()
            torch.cuda.synchronize()
            written = not bool(torch.isnan(out).any())
            err = maxerr(out[items], ref)
            err_torch = maxerr(theirs()[items], ref)
            scale = float(np.max(np.abs(ref)))
            passed = written and err <= 2 * err_torch + FLOOR[dtype_name] * scale
            ok &= passed
            rows.append(
                (
                    "attention",
                    f"N={batch} S={s} H={h} D={d}",
                    dtype_name,
                    err,
                    err_torch,
                    timed(torch, ours),
                    timed(torch, theirs),
                    written,
                    passed,
                )
            )
    return ok


def patch_cases(quick: bool, tiny: bool = False):
    # (name, x shape, patch, E, P, pos mode: "all" | "patches" | None, layernorm)
    cases = [
        ("vit-tiny", (3, 224, 224), (16, 16), 192, 1, "all", True),
        ("vit-base", (3, 224, 224), (16, 16), 768, 1, "all", True),
        ("deit-dist", (3, 224, 224), (16, 16), 192, 2, "all", True),
        ("no-cls,patch-pos", (3, 224, 224), (16, 16), 384, 0, "patches", True),
        ("cls,patch-pos,no-ln", (3, 96, 160), (16, 16), 192, 1, "patches", False),
        ("no-pos,no-ln", (3, 224, 224), (14, 14), 1280, 0, None, False),
        ("video-tubelet", (3, 8, 224, 224), (2, 16, 16), 384, 1, "all", True),
        ("video-no-cls", (3, 16, 112, 112), (2, 16, 16), 192, 0, "patches", True),
    ]
    wide = ("opt-in smem", (3, 64, 64), (16, 16), 1520, 1, "all", True)  # 48 KiB only with its static smem
    if tiny:
        return [cases[0], cases[7]]
    return cases[:4] + cases[6:7] + [wide] if quick else [*cases, wide]


def check_patch_embed(torch, lib, quick: bool, rows: list, tiny: bool = False) -> bool:
    ok = True
    f = torch.nn.functional
    eps = 1e-6
    for name, xshape, patch, e, p, pos_mode, ln in patch_cases(quick, tiny):
        for batch in (1, 8) if not tiny else (2,):
            gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{name}/{batch}".encode()))
            c = xshape[0]
            grid = [xs // ps for xs, ps in zip(xshape[1:], patch, strict=True)]
            n_patch = int(np.prod(grid))
            rnd = lambda *shape: torch.randn(*shape, device="cuda", generator=gen)  # noqa: E731
            base = {
                "x": rnd(batch, *xshape),
                "w": rnd(e, c, *patch) * (1.0 / np.sqrt(c * np.prod(patch))),
                "b": rnd(e) * 0.1,
                "prefix": rnd(1, p, e) if p else None,
                "pos": rnd(1, n_patch + (p if pos_mode == "all" else 0), e) * 0.1 if pos_mode else None,
                "lnw": 1 + 0.1 * rnd(e) if ln else None,
                "lnb": 0.1 * rnd(e) if ln else None,
            }
            for dtype_name, dtype, code in (("float32", torch.float32, 0), ("float16", torch.float16, 1)):
                t = {k: (v.to(dtype).contiguous() if v is not None else None) for k, v in base.items()}
                npy = {k: (v.double().cpu().numpy() if v is not None else None) for k, v in t.items()}
                ref_tok, ref_ln = reference.patch_embed_layernorm(
                    npy["x"],
                    npy["w"],
                    npy["b"],
                    npy["prefix"],
                    npy["pos"],
                    npy["lnw"],
                    npy["lnb"],
                    patch_size=patch,
                    epsilon=eps,
                )
                rows_n = p + n_patch
                tok = torch.full((batch, rows_n, e), float("nan"), device="cuda", dtype=dtype)
                tok_ln = torch.full_like(tok, float("nan")) if ln else None
                video = len(patch) == 3
                prm = PatchParams(
                    batch,
                    c,
                    e,
                    xshape[1] if video else 1,
                    xshape[-2],
                    xshape[-1],
                    patch[0] if video else 1,
                    patch[-2],
                    patch[-1],
                    p,
                    {None: 0, "patches": 1, "all": 2}[pos_mode],
                    int(ln),
                    eps,
                )
                ptr = lambda v: v.data_ptr() if v is not None else None  # noqa: E731
                stream = torch.cuda.current_stream().cuda_stream

                def ours():
                    st = lib.veoPatchEmbedLayerNormForward(
                        ctypes.byref(prm),
                        code,
                        ptr(t["x"]),
                        ptr(t["w"]),
                        ptr(t["b"]),
                        ptr(t["prefix"]),
                        ptr(t["pos"]),
                        ptr(t["lnw"]),
                        ptr(t["lnb"]),
                        ptr(tok),
                        ptr(tok_ln),
                        stream,
                    )
                    if st != 0:
                        raise RuntimeError(lib.veoKernelLastError().decode())

                def theirs():
                    conv = f.conv3d if video else f.conv2d
                    y = conv(t["x"], t["w"], t["b"], stride=patch).flatten(2).transpose(1, 2)
                    if pos_mode == "patches":
                        y = y + t["pos"]
                    if p:
                        y = torch.cat([t["prefix"].expand(batch, -1, -1), y], dim=1)
                    if pos_mode == "all":
                        y = y + t["pos"]
                    y_ln = f.layer_norm(y, (e,), t["lnw"], t["lnb"], eps) if ln else None
                    return y, y_ln

                ours()
                torch.cuda.synchronize()
                written = not bool(torch.isnan(tok).any()) and not (ln and bool(torch.isnan(tok_ln).any()))
                ty, ty_ln = theirs()
                checks = [(tok, ty, ref_tok)] + ([(tok_ln, ty_ln, ref_ln)] if ln else [])
                passed = written
                worst = (0.0, 0.0)
                for got, torch_got, ref in checks:
                    err, err_torch = maxerr(got, ref), maxerr(torch_got, ref)
                    scale = float(np.max(np.abs(ref)))
                    passed &= err <= 2 * err_torch + FLOOR[dtype_name] * scale
                    worst = max(worst, (err, err_torch))
                ok &= passed
                rows.append(
                    (
                        "patch+LN",
                        f"{name} N={batch}",
                        dtype_name,
                        worst[0],
                        worst[1],
                        timed(torch, ours),
                        timed(torch, theirs),
                        written,
                        passed,
                    )
                )
    return ok


class _PrintedRows(list):
    def append(self, row) -> None:
        super().append(row)
        op, case, dt, err, err_t, ms, ms_t, written, passed = row
        flag = "PASS" if passed else ("FAIL" if written else "FAIL (unwritten)")
        line = f"{op:<10} {case:<32} {dt:<8} {err:9.2e} {err_t:9.2e} {ms:8.3f} {ms_t:8.3f} {ms_t / ms:5.2f}  {flag}"
        print(line, flush=True)


OPS = ("attention", "bias", "patch")


def run(torch, lib_path: Path, quick: bool, tiny: bool = False, ops: tuple[str, ...] = OPS) -> bool:
    """Every case of both kernels (``ops``: plain attention, attention with a bias, patch embedding + LN),
    printed as a table; True when all passed."""
    # fp32 baselines must be real fp32: TF32 convolutions/matmuls would loosen every fp32 tolerance
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    lib = load(lib_path)
    hdr = f"{'op':<10} {'case':<32} {'dtype':<8} {'err':>9} {'err_torch':>9} {'ours ms':>8} {'torch ms':>8} {'x':>5}  ok"
    print(hdr)
    print("-" * len(hdr))
    rows = _PrintedRows()  # each case printed as it ends: a run stopped by a timeout keeps what it measured
    ok = check_attention(torch, lib, quick, rows, tiny) if "attention" in ops else True
    if "bias" in ops:
        from checks_attention_bias import check_attention_bias  # VeoAttention v2: the bias input

        ok &= check_attention_bias(torch, lib, quick, rows, FLOOR, timed, maxerr, tiny)
    if "patch" in ops:
        ok &= check_patch_embed(torch, lib, quick, rows, tiny)
    failed = sum(not r[-1] for r in rows)
    print(f"kernels: {len(rows) - failed}/{len(rows)} cases passed")
    return failed == 0


def run_sanitizer(script: Path, lib_path: Path, timeout_s: float = 240) -> bool:
    """The tiny kernel sweep, launched from cuda-python alone (``sanitizer_driver.py``, beside ``script``:
    under a PyTorch process racecheck gave no result in 95 s), under memcheck and racecheck; any reported
    error, or no result within ``timeout_s`` per tool, fails."""
    ok = True
    for tool in ("memcheck", "racecheck"):
        cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "1"]
        if tool == "racecheck":
            cmd += ["--racecheck-report", "all"]
        cmd += [sys.executable, str(Path(script).with_name("sanitizer_driver.py")), str(lib_path)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:  # a hung or very slow tool fails its check, not the whole run
            print(f"compute-sanitizer {tool}: FAIL (no result in {timeout_s:.0f} s)")
            ok = False
            continue
        summary = [
            line
            for line in (r.stdout + r.stderr).splitlines()
            if "ERROR SUMMARY" in line or "RACECHECK SUMMARY" in line
        ]
        passed = r.returncode == 0
        ok &= passed
        print(
            f"compute-sanitizer {tool}: {'PASS' if passed else 'FAIL'} ({'; '.join(summary) or 'no summary'})"
        )
        if not passed:
            print((r.stdout + r.stderr)[-4000:])
    return ok

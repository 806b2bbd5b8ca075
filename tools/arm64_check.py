#!/usr/bin/env python3
"""The Orin image's CPU fallback on aarch64, proven on an x86-64 machine: images built and run under QEMU.

Run through ``tools/arm64-check.sh`` (``make arm64-check``), which installs QEMU, registers it with
binfmt_misc and makes the stand-in root filesystems first; see docs/images.md. On its own private dockerd:

1. stand-in bases from the root filesystem tarballs (``FROM scratch`` + ``ADD rootfs.tar`` built with
   ``--platform``, which records the platform; ``docker import`` would record amd64): an arm64 Debian
   base for the cpu image, the same tagged as the L4T base ``Dockerfile.jetson`` names, and an x86-64
   Debian tagged as the A100 image's CUDA base. None has CUDA or TensorRT.
2. ``veo-edge build`` of vit-digits (f32), then three images through ``veo-edge image build``: cpu for
   linux/arm64, orin (``Dockerfile.jetson``) and a100 with ``--no-plugin-libs``.
3. each image started (arm64 ones under emulation): ready, ``healthcheck`` (canary included) inside it,
   /metrics and the logs saying why TensorRT was passed over, a 30 s soak of its server (driven from the
   host: the soak's recorder is not in the image), and the arm64 IR's outputs against this machine's on
   the canary and the digits test split, within the build's OpenVINO parity tolerance.

Prints a summary (and writes summary.json into the work directory); exit 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.dockerd import DockerEngine, remove_root  # noqa: E402
from veo_edge.targets import TARGETS  # noqa: E402

ARM_BASE = "veo-edge/base:bookworm-python3-arm64"
CACHE = Path(os.environ.get("VEO_EDGE_CACHE", Path.home() / ".cache" / "veo-edge"))
ROOTFS = {
    "linux/arm64": CACHE / "base-bookworm-python3-slim-arm64.tar",
    "linux/amd64": CACHE / "base-bookworm-python3-slim.tar",
}
#: (name, target, platform, base image tag, stand-in of) per image
IMAGES = (
    ("cpu-arm64", "cpu", "linux/arm64", ARM_BASE, None),
    ("orin", "orin", "linux/arm64", TARGETS["orin"].base_image, "L4T r36.4 / JetPack 6"),
    ("a100", "a100", "linux/amd64", TARGETS["a100"].base_image, "NGC TensorRT 24.08"),
)
#: the build's f32 IR through OpenVINO, one static-shape compile per input set (the whole test split is
#: one batch: under emulation a compile per batch size would take most of an hour), written as .npy
PARITY = r"""
import sys, numpy as np, openvino as ov
from veo_edge.builddir import BuildDir
from veo_edge.runtime.backends.openvino_compile import compile_config
b = BuildDir.open(sys.argv[1])
core = ov.Core()
for tag in ("canary", "test"):
    x = np.load(f"{sys.argv[2]}/in_{tag}.npy")
    model = core.read_model(b.artifact("openvino_xml"))
    model.reshape({model.inputs[0]: list(x.shape)})
    compiled = core.compile_model(model, "CPU", compile_config("f32"))
    assert compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == "f32"
    np.save(f"{sys.argv[2]}/out_{tag}_{sys.argv[3]}.npy", compiled(x)[compiled.outputs[0]])
"""


class Summary:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, str]] = []  # (step, PASS/FAIL, seconds, detail)
        self.t0 = time.monotonic()

    def step(self, name: str, fn, *args):
        t = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            detail = fn(*args)
            ok = True
        except Exception as e:  # a failed step is reported and the run goes on where it can
            detail, ok = f"{type(e).__name__}: {e}", False
        secs = time.monotonic() - t
        self.rows.append((name, "PASS" if ok else "FAIL", secs, str(detail or "")))
        print(f"   {'PASS' if ok else 'FAIL'} in {secs:.0f} s: {detail}", flush=True)
        return ok

    def print(self, out: Path) -> bool:
        total = time.monotonic() - self.t0
        width = max(len(r[0]) for r in self.rows)
        print(f"\n{'step':<{width}}  result  seconds  detail")
        for name, res, secs, detail in self.rows:
            print(f"{name:<{width}}  {res:<6}  {secs:7.0f}  {detail}")
        ok = all(r[1] == "PASS" for r in self.rows)
        print(f"\narm64 check: {'ALL PASSED' if ok else 'FAILURES'} in {total / 60:.1f} min")
        out.write_text(json.dumps({"total_s": total, "passed": ok, "steps": self.rows}, indent=1) + "\n")
        return ok


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def veo(*args: str, env: dict | None = None, timeout: int = 3600) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "veo_edge", *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    if r.returncode != 0:
        raise RuntimeError(
            f"veo-edge {' '.join(args[:2])} exited {r.returncode}: {(r.stderr or r.stdout)[-1500:]}"
        )
    return r.stdout


def stand_in_base(client, tag: str, platform: str) -> str:
    with tempfile.TemporaryDirectory(prefix="veo-standin-", dir=CACHE) as tmp:
        try:
            os.link(ROOTFS[platform], Path(tmp) / "rootfs.tar")
        except OSError:
            shutil.copy2(ROOTFS[platform], Path(tmp) / "rootfs.tar")
        (Path(tmp) / "Dockerfile").write_text(
            'FROM scratch\nADD rootfs.tar /\nENV LANG=C.UTF-8\nCMD ["/bin/bash"]\n'
        )
        for _ in client.api.build(path=tmp, tag=tag, platform=platform, rm=True, decode=True):
            pass
    img = client.images.get(tag)
    arch = f"{img.attrs['Os']}/{img.attrs['Architecture']}"
    if arch != platform:
        raise RuntimeError(f"{tag} records {arch}, not {platform}")
    return f"{tag} ({arch}, {img.attrs['Size'] / 1e6:.0f} MB)"


def build_image(engine, build: Path, key: Path, name: str, target: str, platform: str, base: str) -> str:
    extra = ["--base-image", base] if target == "cpu" else ["--no-plugin-libs"]
    out = veo(
        "image", "build", str(build), "--target", target, "--platform", platform, "--image",
        f"veo-edge/arm64-check:{name}", "--sign-key", str(key), "--context-dir",
        str(build.parent / f"ctx-{name}"), "--force", "--json", *extra,
        env=engine.env,
    )  # fmt: skip
    info = json.loads(out[out.index("{") :])
    ctx = build.parent / f"ctx-{name}"
    made_for = json.loads((ctx / "build-args.json").read_text())
    left_out = [
        ln[2:] for ln in (ctx / "app" / "requirements.lock").read_text().splitlines() if "left out" in ln
    ]
    labels = engine.client.images.get(info["image"]).labels
    return (
        f"{info['image']} {info['size_bytes'] / 1e6:.0f} MB for {made_for['platform']}, Python "
        f"{made_for['python']} / glibc {made_for['glibc']} (the wheelhouse's, read from {base}); "
        f"plugins={labels.get('io.veo-edge.plugins')}; serving={labels.get('io.veo-edge.serving')!r}"
        + (f"; {left_out[0][:120]}" if left_out else "")
    )


def get(url: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


#: what an Arm64 device's /proc/cpuinfo says of each core (Jetson Orin's Cortex-A78AE: implementer 0x41,
#: part 0xd42). Under QEMU user emulation /proc/cpuinfo is this x86-64 host's, and ONNX Runtime's CPU
#: detection segfaults on it at import; a device shows this, so the arm64 server gets it mounted
ARM_CORE = """processor\t: {n}
BogoMIPS\t: 62.50
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd42
CPU revision\t: 1

"""


def arm_cpuinfo(work: Path) -> dict:
    """A bind mount of an Arm64 /proc/cpuinfo (one core per CPU of this machine) for an arm64 container."""
    path = work / "arm64-cpuinfo"
    path.write_text("".join(ARM_CORE.format(n=n) for n in range(os.cpu_count() or 1)))
    return {str(path): {"bind": "/proc/cpuinfo", "mode": "ro"}}


def faults_for(target: str) -> dict | None:
    """The cpu image runs with OpenVINO failing every 7th call (transient): each failed batch must be
    re-run on the ONNX Runtime standby, so the soak's 0 errors prove the fallback on arm64 (retries > 0)."""
    return {"openvino": {"every_nth": 7}} if target == "cpu" else None


def run_container(engine, name: str, platform: str, port: int, work: Path, faults: dict | None = None):
    client = engine.client
    env = {"VEO_EDGE_FAULTS": json.dumps(faults)} if faults else {}
    ctr = client.containers.run(
        f"veo-edge/arm64-check:{name}", detach=True, network_mode="host", platform=platform,
        name=f"veo-arm64-check-{name}",
        environment={"VEO_EDGE_PORT": str(port), "VEO_EDGE_GRPC_PORT": str(free_port()),
                     "VEO_EDGE_HOST": "127.0.0.1", "VEO_EDGE_HEALTH_TIMEOUT": "120", **env},
        # the image's HEALTHCHECK starts an emulated Python every 10 s: off here, the check runs it itself
        healthcheck={"test": ["NONE"]}, init=True,
        volumes=arm_cpuinfo(work) if platform == "linux/arm64" else None,
    )  # fmt: skip
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        ctr.reload()
        if ctr.status == "exited":
            raise RuntimeError(f"{name} exited: {ctr.logs(tail=20).decode(errors='replace')}")
        try:
            if json.loads(get(f"http://127.0.0.1:{port}/v2/health/ready", 5) or "{}") is not None:
                break
        except OSError:
            pass
        time.sleep(3)
    else:
        raise RuntimeError(f"{name} not ready within 20 min: {ctr.logs(tail=20).decode(errors='replace')}")
    return ctr


def checks_in_container(engine, name: str, target: str, platform: str, port: int, work: Path) -> str:
    ctr = run_container(engine, name, platform, port, work, faults_for(target))
    standby = json.loads(get(f"http://127.0.0.1:{port}/v2/health/ready"))["standby_backend"]
    if standby != "onnxruntime":  # every image ships ONNX Runtime's CPU provider as auto's CPU standby
        raise RuntimeError(f"the {name} image's standby is {standby!r}, not onnxruntime")
    code, out = ctr.exec_run(["/opt/veo-edge/healthcheck/healthcheck.sh"])
    if code != 0:
        raise RuntimeError(f"healthcheck exited {code}: {out.decode(errors='replace')[-500:]}")
    metrics = get(f"http://127.0.0.1:{port}/metrics")
    active = [ln for ln in metrics.splitlines() if ln.startswith("veo_edge_active_backend{")]
    skipped = [ln for ln in metrics.splitlines() if ln.startswith("veo_edge_backend_skipped{")]
    logs = ctr.logs().decode(errors="replace")
    # a GPU image says FALLBACK (no GPU visible / no TensorRT); the cpu image says it serves on the CPU
    said = [ln for ln in logs.splitlines() if "FALLBACK" in ln or "serving with OpenVINO on the CPU" in ln]
    if not any('backend="openvino"' in ln for ln in active):
        raise RuntimeError(f"not serving on OpenVINO: {active}")
    if not any('backend="tensorrt"' in ln for ln in skipped) or not said:
        raise RuntimeError(f"/metrics or the logs do not say why TensorRT was passed over: {skipped} {said}")
    (Path(tempfile.gettempdir()) / f"veo-arm64-check-{name}.log").write_text(logs + "\n" + metrics)
    return (
        f"healthcheck: {out.decode(errors='replace').strip().splitlines()[-1][:100]}; standby: {standby}; "
        f"{active[0]}; "
        f"{skipped[0][:200]}; log: {said[0][:160]}"
    )


def soak(engine, name: str, target: str, port: int, work: Path) -> str:
    run_dir = work / f"soak-{name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    # under emulation latency means nothing: the verdict's latency/leak limits are opened, errors are not
    subprocess.run(
        [sys.executable, "-m", "veo_edge", "soak", "run", "--url", f"http://127.0.0.1:{port}", "--duration", "30s",
         "--out", str(run_dir), "--no-live", "--max-jitter-ms", "1e9", "--leak-floor", "10GiB",
         "--max-fragmentation", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = json.loads((run_dir / "report.json").read_text())
    req = report["requests"]
    if req["errors"] or req["timeouts"] or req["lost"] or not req["ok"]:
        raise RuntimeError(f"soak: {req}")
    fb = report["fallbacks"]
    if faults_for(target) and not fb["retries"]:  # its failed batches must have been re-run
        raise RuntimeError(f"soak: run with faults {faults_for(target)}, yet no retry was counted: {fb}")
    retried = f"; faults {fb['faults']}, retries {fb['retries']}" if fb["retries"] else ""
    return f"{req['ok']} answered, 0 errors/timeouts/lost in 30 s; backends {fb['backends']}{retried}"


def parity(engine, name: str, platform: str, build: Path, work: Path) -> str:
    import numpy as np

    from veo_edge.builddir import BuildDir

    io = work / "parity"
    b = BuildDir.open(build)
    tol = max(p["tolerance"] for p in b.manifest["parity"] if p["candidate"] == "openvino")
    canary = b.manifest["canary"]
    arch = platform.split("/")[1]
    engine.client.containers.run(
        f"veo-edge/arm64-check:{name}", ["-c", PARITY, "/opt/veo-edge/model", "/parity", arch],
        entrypoint=["/opt/veo-edge/venv/bin/python"], platform=platform, remove=True,
        volumes={str(io): {"bind": "/parity", "mode": "rw"}}, network_disabled=True,
        healthcheck={"test": ["NONE"]},  # no server here
    )  # fmt: skip
    lines = []
    for tag in ("canary", "test"):
        ours, theirs = np.load(io / f"out_{tag}_host.npy"), np.load(io / f"out_{tag}_{arch}.npy")
        err = float(np.max(np.abs(ours - theirs)))
        agree = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
        limit = min(tol, canary["atol"]) if tag == "canary" else tol
        if err > limit or agree < 1.0:
            raise RuntimeError(f"{tag}: max abs {err:.3g} > {limit:.3g} or top-1 agreement {agree:.3f} < 1")
        lines.append(f"{tag} ({len(ours)}): max abs {err:.2g} <= {limit:.2g}, top-1 agreement {agree:.0%}")
    y = np.load(io / "labels_test.npy")
    acc = float(np.mean(np.load(io / f"out_test_{arch}.npy").argmax(-1) == y))
    return f"{arch} vs this machine: " + "; ".join(lines) + f"; {arch} top-1 on the test split {acc:.1%}"


def host_outputs(build: Path, work: Path) -> str:
    import numpy as np

    from veo_edge.builddir import BuildDir
    from veo_edge.models.digits import test_split

    io = work / "parity"
    io.mkdir(parents=True, exist_ok=True)
    io.chmod(0o777)  # the image's user (10001) writes its outputs here
    b = BuildDir.open(build)
    np.save(io / "in_canary.npy", np.load(b.artifact("canary_input")).astype(np.float32))
    split = test_split()
    np.save(io / "in_test.npy", split.x.astype(np.float32))
    np.save(io / "labels_test.npy", split.y)
    subprocess.run([sys.executable, "-c", PARITY, str(build), str(io), "host"], check=True)
    for p in io.iterdir():
        p.chmod(0o666)
    return f"canary + {len(split.x)} test samples through OpenVINO f32 on this machine"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "veo-arm64-check")
    ap.add_argument("--only", default="cpu-arm64,orin,a100", help="images to build and check")
    args = ap.parse_args()
    only = set(args.only.split(","))
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for platform, tar in ROOTFS.items():
        if not tar.is_file():
            print(
                f"missing stand-in root filesystem {tar} for {platform}: run tools/arm64-check.sh",
                file=sys.stderr,
            )
            return 2
    summary = Summary()
    engine = DockerEngine(Path(tempfile.mkdtemp(prefix="veo-a64-", dir="/tmp")))
    engine.start()
    import docker

    engine.client = docker.DockerClient(base_url=engine.host, timeout=3600)
    try:
        made = set()
        for name, _target, platform, base, of in IMAGES:
            if name in only and base not in made:
                made.add(base)
                what = f"stand-in for {of}: {base}" if of else f"base {base}"
                summary.step(what, stand_in_base, engine.client, base, platform)
        build = work / "vit-digits"
        from tests.support.images import ed25519_pem

        key = ed25519_pem(work / "sign.pem")
        summary.step(
            "veo-edge build vit-digits (f32)",
            veo,
            "build",
            "--model",
            "vit-digits",
            "--out",
            str(build),
            "--quiet",
        )
        summary.step("x86-64 OpenVINO outputs (reference)", host_outputs, build, work)
        for name, target, platform, base, _of in IMAGES:
            if name not in only:
                continue
            if not summary.step(
                f"{name}: image ({platform})", build_image, engine, build, key, name, target, platform, base
            ):
                continue
            port = free_port()
            if summary.step(
                f"{name}: start, healthcheck, /metrics, logs",
                checks_in_container,
                engine,
                name,
                target,
                platform,
                port,
                work,
            ):
                summary.step(f"{name}: 30 s soak", soak, engine, name, target, port, work)
            for ctr in engine.client.containers.list(all=True, filters={"name": f"veo-arm64-check-{name}"}):
                ctr.remove(force=True)
            summary.step(f"{name}: IR parity vs x86-64", parity, engine, name, platform, build, work)
    finally:
        engine.close()
        remove_root(engine.root)
    return 0 if summary.print(work / "summary.json") else 1


if __name__ == "__main__":
    sys.exit(main())

"""Our IR (`veo-edge build --hf`) against optimum-intel's (`optimum-cli export openvino`) on one checkpoint.

    python bench/optimum_intel.py --optimum-python PATH/venv-with-optimum-intel/bin/python
                                  [--work DIR] [--seconds 4] [--rounds 3] [--samples 64]

optimum-intel 2.2 needs transformers < 5.6, so it runs from its own venv (as the Triton bench runs
PyTriton): only its export runs there; both IRs are then read and compiled here, by the same OpenVINO,
under the same settings (f32 stated, batch axis fixed at 1, the same hint and threads).

The checkpoint: ``bench/_hf.py`` (a seeded random-init ViT, 192 wide, 12 layers, 224²). Reported:
- top-1 agreement and the largest logit difference on ``--samples`` seeded inputs and the two sample
  photographs (preprocessed by the build's manifest);
- latency: p50 of back-to-back sync infers on a LATENCY compile, batch 1;
- throughput: an AsyncInferQueue kept full on a THROUGHPUT compile, batch 1;
each ours / optimum's, interleaved ``--rounds`` times (medians); and the ops in each IR.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from _hf import hf_build, vit_checkpoint


def export_optimum(python: str, ckpt: Path, out: Path) -> Path:
    if not (out / "openvino_model.xml").is_file():
        cli = str(Path(python).parent / "optimum-cli")
        cmd = [cli, "export", "openvino", "--model", str(ckpt), "--task", "image-classification", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"optimum-cli failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out / "openvino_model.xml"


def optimum_version(python: str) -> str:
    code = "import importlib.metadata as m; print(m.version('optimum-intel'), m.version('transformers'), m.version('openvino'))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def static(core, xml: Path):
    import openvino as ov

    model = core.read_model(str(xml))
    model.reshape({model.inputs[0]: ov.PartialShape([1, 3, 224, 224])})
    return model


def latency_ms(compiled, x: np.ndarray, seconds: float) -> float:
    req = compiled.create_infer_request()
    for _ in range(5):
        req.infer([x])
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        req.infer([x])
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def throughput(compiled, x: np.ndarray, seconds: float) -> float:
    import openvino as ov

    nreq = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
    queue = ov.AsyncInferQueue(compiled, nreq)
    for _ in range(2 * nreq):
        queue.start_async([x])
    queue.wait_all()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        queue.start_async([x])
        n += 1
    queue.wait_all()
    return n / (time.perf_counter() - start)


def inputs(build: Path, samples: int) -> np.ndarray:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    from veo_edge.builddir import BuildDir
    from veo_edge.export.parity import seeded_inputs
    from veo_edge.preprocess import Preprocess

    prep = Preprocess.from_manifest(BuildDir.open(build).manifest["preprocess"])
    photos = np.stack([prep(Image.fromarray(a)) for a in load_sample_images().images])
    return np.concatenate([seeded_inputs((3, 224, 224), samples, 0), photos]).astype(np.float32)


def main() -> None:
    import openvino as ov

    from veo_edge.runtime.backends.openvino import compile_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimum-python", required=True)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "veo-bench-hf")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=64)
    args = ap.parse_args()
    ckpt = vit_checkpoint(args.work / "vit-hf")
    build = hf_build(ckpt, args.work / "vit-hf-build")
    theirs_xml = export_optimum(args.optimum_python, ckpt, args.work / "vit-hf-optimum")
    ours_xml = build / "openvino" / "model.xml"
    core = ov.Core()
    print(
        f"optimum-intel, its transformers and OpenVINO: {optimum_version(args.optimum_python)}; ours: OpenVINO {ov.get_version()}"
    )
    irs = {"ours": static(core, ours_xml), "optimum": static(core, theirs_xml)}
    for name, model in irs.items():
        print(f"{name}: {len(model.get_ops())} ops, inputs {[i.get_any_name() for i in model.inputs]}")

    x = inputs(build, args.samples)
    logits = {}
    for name, model in irs.items():
        compiled = core.compile_model(model, "CPU", compile_config("f32", None, "LATENCY"))
        logits[name] = np.concatenate([compiled([x[i : i + 1]])[0] for i in range(len(x))])
    agree = float((logits["ours"].argmax(1) == logits["optimum"].argmax(1)).mean())
    diff = float(np.abs(logits["ours"] - logits["optimum"]).max())
    print(
        f"top-1 agreement {agree:.2%} on {len(x)} inputs ({args.samples} seeded + 2 photographs), max |logit diff| {diff:.2g}"
    )

    lat: dict[str, list[float]] = {"ours": [], "optimum": []}
    thr: dict[str, list[float]] = {"ours": [], "optimum": []}
    one = x[:1]
    for r in range(args.rounds):
        order = ("ours", "optimum") if r % 2 == 0 else ("optimum", "ours")
        for name in order:
            c = core.compile_model(irs[name], "CPU", compile_config("f32", None, "LATENCY"))
            lat[name].append(latency_ms(c, one, args.seconds))
            del c
            c = core.compile_model(irs[name], "CPU", compile_config("f32", None, "THROUGHPUT"))
            thr[name].append(throughput(c, one, args.seconds))
            del c
        print(
            f"round {r + 1}: " + ", ".join(f"{n} p50 {lat[n][-1]:.2f} ms {thr[n][-1]:.1f}/s" for n in order)
        )
    lo, lt = statistics.median(lat["ours"]), statistics.median(lat["optimum"])
    to, tt = statistics.median(thr["ours"]), statistics.median(thr["optimum"])
    print("\n| IR | ops | p50 ms (LATENCY, b1) | images/s (THROUGHPUT, b1) |")
    print("| --- | --- | --- | --- |")
    print(f"| ours (`build --hf`) | {len(irs['ours'].get_ops())} | {lo:.2f} | {to:.1f} |")
    print(f"| optimum-intel | {len(irs['optimum'].get_ops())} | {lt:.2f} | {tt:.1f} |")
    print(f"| ours / optimum | | {lo / lt:.3f}x latency | {to / tt:.3f}x throughput |")


if __name__ == "__main__":
    main()

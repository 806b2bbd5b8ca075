"""`pip install veo-edge` builds image contexts: the wheel carries the files the contexts are made from
(``veo_edge/_image_sources``), and the context's veo-edge wheel is the installed one, packed again from
its installed files rather than rebuilt from a source tree.

The wheel is installed into a venv of its own outside the checkout and driven from a tmp cwd, so the
checkout is not on its ``sys.path``. The venv finds the dependencies through a ``.pth`` line naming this
interpreter's site-packages (``venv --system-site-packages`` would give the base interpreter's
site-packages, not the dev venv's); ``.pth`` files inside that folder are not run, so the checkout's
editable finder stays out. pip sees the checkout's editable veo-edge on that path, hence
``--ignore-installed``: it installs into the new venv and touches nothing else."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from veo_edge.builddir import sha256_file
from veo_edge.errors import PackagingError
from veo_edge.packaging import layout, sources

REPO = Path(__file__).resolve().parents[2]
SELINUX_PP_MAGIC = 0xF97CFF8F

# run inside the venv: the cpu context of a build, without downloads; prints where it read from
_ASSEMBLE = """
import json, sys
from pathlib import Path
import veo_edge
from veo_edge.packaging import sources
from veo_edge.packaging.context import ContextOptions, assemble_context
from veo_edge.targets import get_target
build, out = Path(sys.argv[1]), Path(sys.argv[2])
ctx = assemble_context(ContextOptions(build_dir=build, target=get_target("cpu"), out=out,
                                      download_wheels=False))
print(json.dumps({"package": veo_edge.__file__, "checkout": sources.from_checkout(),
                  "root": str(sources.source_root()), "context": str(ctx.path)}))
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, f"{cmd[:4]} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def selinux_tools() -> None:
    if not (shutil.which("checkmodule") and shutil.which("semodule_package")):
        pytest.skip("checkmodule/semodule_package not installed (apt-get install checkpolicy semodule-utils)")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, veo_wheel: Path) -> SimpleNamespace:
    """The checkout's wheel (the session's ``veo_wheel``), installed into a fresh venv outside the
    checkout."""
    work = tmp_path_factory.mktemp("wheel-install")
    wheel = veo_wheel
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=work).stdout.strip())  # fmt: skip
    (site / "veo-edge-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(wheel)], cwd=work)
    return SimpleNamespace(work=work, wheel=wheel, python=python, site=site)


def test_the_wheel_carries_the_image_sources(installed) -> None:
    packaged = installed.site / "veo_edge" / layout.PACKAGED_DIR
    shipped = sorted(  # the __pycache__ pip writes beside tools/gen_spec_header.py is not the wheel's
        p.relative_to(packaged).as_posix()
        for p in packaged.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert shipped == sorted(layout.image_source_files(REPO))
    for rel in shipped:
        assert (packaged / rel).read_bytes() == (REPO / rel).read_bytes(), rel
    assert not (packaged / "plugins" / "tests").exists(), "the host tests are not for the image"
    assert {"plugins/veoAttention/veoAttentionKernel.cu", "plugins/tools/gen_spec_header.py"} <= set(shipped)
    assert (packaged / "packaging" / "entrypoint.sh").stat().st_mode & 0o111


@pytest.mark.slow
def test_an_installed_wheel_makes_a_cpu_context_with_itself_inside(
    installed, nano_build: Path, selinux_tools
) -> None:
    r = _run([str(installed.python), "-c", _ASSEMBLE, str(nano_build), str(installed.work / "ctx")],
             cwd=installed.work)  # fmt: skip
    ran = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(ran["package"]).is_relative_to(installed.site) and not ran["checkout"]
    assert Path(ran["root"]) == installed.site / "veo_edge" / layout.PACKAGED_DIR
    cpu = Path(ran["context"])
    # the files the engine reads, from the wheel's copy (a GPU context's plugins/ is the same function's
    # list, layout.plugin_files, checked against the wheel above; its SBOM would cost another ~6 s here)
    assert (cpu / "Dockerfile").read_bytes() == (REPO / "packaging" / "Dockerfile").read_bytes()
    app = cpu / "app"
    for got, want in (("bin/entrypoint.sh", "packaging/entrypoint.sh"),
                      ("healthcheck/healthcheck.sh", "healthcheck/healthcheck.sh")):  # fmt: skip
        assert (app / got).read_bytes() == (REPO / want).read_bytes() and (app / got).stat().st_mode & 0o111
    for name in layout.SELINUX_SOURCES:
        assert (app / "selinux" / name).read_bytes() == (REPO / "packaging" / "selinux" / name).read_bytes()
    assert struct.unpack("<I", (app / "selinux" / "veo_edge.pp").read_bytes()[:4])[0] == SELINUX_PP_MAGIC
    sbom = json.loads((app / "sbom.cdx.json").read_text())
    assert sbom["metadata"]["component"]["name"] == "veo-edge"
    assert not (cpu / "plugins").exists()
    # the image installs the very wheel that is installed: same name, files and bytes (RECORD: same rows)
    (packed,) = (cpu / "wheels").glob("veo_edge-*.whl")
    assert packed.name == installed.wheel.name
    assert f"--hash=sha256:{sha256_file(packed)}" in (cpu / "wheels" / "requirements.lock").read_text()
    with zipfile.ZipFile(installed.wheel) as want, zipfile.ZipFile(packed) as got:
        assert sorted(got.namelist()) == sorted(want.namelist())
        for name in want.namelist():
            if name.endswith(".dist-info/RECORD"):
                rows = [sorted(z.read(name).decode().splitlines()) for z in (got, want)]
                assert rows[0] == rows[1]
            else:
                assert got.read(name) == want.read(name), name


def test_an_installed_file_changed_after_install_is_refused(installed, tmp_path: Path) -> None:
    target = installed.site / "veo_edge" / "targets.py"
    original = target.read_bytes()
    code = "from pathlib import Path; import sys; from veo_edge.packaging import ownwheel; ownwheel.build_own_wheel(Path(sys.argv[1]))"
    try:
        target.write_bytes(original + b"\n# edited\n")
        proc = subprocess.run([str(installed.python), "-c", code, str(tmp_path)], cwd=tmp_path, env=_env(),
                              capture_output=True, text=True)  # fmt: skip
    finally:
        target.write_bytes(original)
    assert proc.returncode != 0
    assert "targets.py differs from its RECORD" in proc.stderr and "--force-reinstall" in proc.stderr


def test_no_checkout_and_no_packaged_copy_says_what_to_do(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sources, "REPO_ROOT", tmp_path / "site-packages")
    monkeypatch.setattr(sources, "PACKAGED_ROOT", tmp_path / "site-packages" / "veo_edge" / "_image_sources")
    with pytest.raises(PackagingError, match=r"neither a checkout at .* nor the copy a wheel carries") as e:
        sources.source_root()
    assert "pip install --force-reinstall veo-edge" in str(e.value) and "pip install -e ." in str(e.value)
    assert "packaging/Dockerfile" in str(e.value)

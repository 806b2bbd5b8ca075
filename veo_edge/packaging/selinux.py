"""The SELinux policy module the image carries: ``packaging/selinux/veo_edge.{te,fc,if}``, in the
reference policy's module language, compiled into ``veo_edge.pp`` with the policy development Makefile
(Debian/Ubuntu: ``apt-get install selinux-policy-dev``; Fedora: ``dnf install selinux-policy-devel``)
against the pinned container-selinux interface declarations in ``packaging/selinux/container-selinux/``.

The development headers' own ``services/container.if`` (the reference policy's container module, other
templates under the same names) is swapped for the pinned one in a header tree made for the build: the
headers' directories with each file linked, ``container.if`` replaced, and ``refpolicy-compat.spt`` added
for the two Fedora-policy macros container-selinux uses. Installing the module is the host's job
(``semodule -i``): see packaging/selinux/README.md."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from veo_edge.errors import PackagingError
from veo_edge.packaging.layout import SELINUX_SOURCES
from veo_edge.packaging.sources import source_root

MODULE = "veo_edge"
SOURCES = SELINUX_SOURCES
DEVEL = Path("/usr/share/selinux/devel")
PINNED_IF = "container-selinux/container.if"
COMPAT = "refpolicy-compat.spt"


def _header_tree(devel_include: Path, src: Path, dest: Path) -> Path:
    """``devel_include`` with ``services/container.if`` replaced by the pinned one (real directories, so
    the Makefile finds each layer; files linked, not copied)."""
    dest.mkdir(parents=True)
    for layer in devel_include.iterdir():
        if layer.is_dir():
            (dest / layer.name).mkdir(parents=True)
            for f in layer.iterdir():
                os.symlink(f, dest / layer.name / f.name)
        else:
            os.symlink(layer, dest / layer.name)
    (dest / "services" / "container.if").unlink(missing_ok=True)
    shutil.copy2(src / PINNED_IF, dest / "services" / "container.if")
    shutil.copy2(src / COMPAT, dest / "support" / f"zz-{COMPAT}")
    return dest


def compile_module(dest: Path, devel: Path = DEVEL) -> Path:
    """Copy the sources into ``dest`` and compile ``dest/veo_edge.pp``; returns its path."""
    make = shutil.which("make")
    tools = [t for t in ("checkmodule", "semodule_package", "m4") if shutil.which(t) is None]
    if make is None or tools or not (devel / "Makefile").is_file():
        missing = ", ".join([*(["make"] if make is None else []), *tools]) or f"{devel}/Makefile"
        raise PackagingError(
            f"{missing} not found: the image carries a compiled SELinux module, built with the policy "
            "development files; install them (Debian/Ubuntu: apt-get install selinux-policy-dev; Fedora: "
            "dnf install selinux-policy-devel)"
        )
    src = source_root() / "packaging" / "selinux"
    dest.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / name, dest / name)
    with tempfile.TemporaryDirectory(prefix="veo-selinux-") as tmp:
        work = Path(tmp) / "module"
        work.mkdir()
        for ext in ("te", "fc", "if"):
            shutil.copy2(src / f"{MODULE}.{ext}", work / f"{MODULE}.{ext}")
        headers = _header_tree(devel / "include", src, Path(tmp) / "include")
        cmd = [make, "-f", str(devel / "Makefile"), f"HEADERDIR={headers}", f"{MODULE}.pp"]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if "ERROR" in ln or "rror" in ln]
            raise PackagingError(
                f"compiling the SELinux module {src / (MODULE + '.te')} failed (exit {proc.returncode}): "
                f"{' | '.join(lines[:3]) or proc.stderr.strip()[-400:]}"
            )
        shutil.copy2(work / f"{MODULE}.pp", dest / f"{MODULE}.pp")
    return dest / f"{MODULE}.pp"

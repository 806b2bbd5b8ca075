"""The SELinux policy module the image carries: ``packaging/selinux/veo_edge.{te,fc,if}`` compiled with
``checkmodule`` and ``semodule_package`` (Debian: ``apt-get install checkpolicy semodule-utils``) into
``veo_edge.pp``. Installing it is the host's job (``semodule -i``): see packaging/selinux/README.md."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from veo_edge.errors import PackagingError
from veo_edge.packaging.layout import SELINUX_SOURCES
from veo_edge.packaging.sources import source_root

MODULE = "veo_edge"
SOURCES = SELINUX_SOURCES


def compile_module(dest: Path) -> Path:
    """Copy the sources into ``dest`` and compile ``dest/veo_edge.pp``; returns its path."""
    tools = {t: shutil.which(t) for t in ("checkmodule", "semodule_package")}
    missing = [t for t, p in tools.items() if p is None]
    if missing:
        raise PackagingError(
            f"{' and '.join(missing)} not found: the image carries a compiled SELinux module; install them "
            "(Debian/Ubuntu: apt-get install checkpolicy semodule-utils; Fedora: dnf install checkpolicy "
            "policycoreutils)"
        )
    src = source_root() / "packaging" / "selinux"
    dest.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        shutil.copy2(src / name, dest / name)
    mod, pp = dest / f"{MODULE}.mod", dest / f"{MODULE}.pp"
    for cmd in (
        [tools["checkmodule"], "-M", "-m", "-o", str(mod), str(dest / f"{MODULE}.te")],
        [tools["semodule_package"], "-o", str(pp), "-m", str(mod), "-f", str(dest / f"{MODULE}.fc")],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PackagingError(
                f"{Path(cmd[0]).name} failed on {src} (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
            )
    mod.unlink()
    return pp

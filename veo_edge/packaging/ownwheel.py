"""veo-edge's own wheel for an image's wheelhouse: the veo-edge that is running, whichever way it was
installed.

- From a checkout (``pip install -e .``): built by ``pip wheel`` from a copy of the source tree, so that
  the image carries the working tree's edits (the checkout stays untouched).
- From an installed wheel: packed again from the installed distribution's files as its ``RECORD`` lists
  them, each checked against the sha256 recorded at install time. Nothing is rebuilt from sources, so
  the image gets the very files this install runs. Left out are only what an installer adds beside a
  wheel's contents: ``INSTALLER``, ``REQUESTED``, ``direct_url.json`` (PEP 376/610), byte-compiled
  ``__pycache__`` files, and the console scripts it generates from ``entry_points.txt``; ``RECORD`` is
  written anew for the packed files.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

from veo_edge.errors import PackagingError
from veo_edge.packaging import layout, sources

DIST = "veo-edge"
#: dist-info files an installer writes, not part of the wheel
_INSTALLER_FILES = frozenset({"INSTALLER", "REQUESTED", "direct_url.json"})
_ZIP_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can carry


def build_own_wheel(dest: Path) -> Path:
    """The running veo-edge as a wheel in ``dest``; returns its path."""
    dest.mkdir(parents=True, exist_ok=True)
    if sources.from_checkout():
        return wheel_from_source_tree(sources.REPO_ROOT, dest)
    return wheel_from_installed(dest)


def wheel_from_source_tree(src: Path, dest: Path) -> Path:
    """``pip wheel`` of a copy of the checkout ``src``: the package, setup.py's inputs and the image
    sources it copies into the wheel."""
    with tempfile.TemporaryDirectory(prefix="veo-wheel-") as tmp:
        work = Path(tmp) / "src"
        work.mkdir()
        for name in ("pyproject.toml", "setup.py", "README.md"):
            shutil.copy2(src / name, work / name)
        shutil.copytree(
            src / "veo_edge",
            work / "veo_edge",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_plugin_specs", layout.PACKAGED_DIR),
        )
        for rel in layout.image_source_files(src):
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, work / rel)
        before = set(dest.glob("veo_edge-*.whl"))
        cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        proc = subprocess.run([*cmd, "--wheel-dir", str(dest), str(work)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise PackagingError(
            f"building the veo-edge wheel (pip wheel) failed (exit {proc.returncode}): {tail}"
        )
    made = sorted(set(dest.glob("veo_edge-*.whl")) - before) or sorted(dest.glob("veo_edge-*.whl"))
    if not made:
        raise PackagingError(f"pip wheel made no veo-edge wheel in {dest}")
    return made[-1]


def _record_hash(data: bytes, algorithm: str = "sha256") -> str:
    """A RECORD hash field: ``<algorithm>=<urlsafe base64 digest, unpadded>``."""
    digest = hashlib.new(algorithm, data).digest()
    return f"{algorithm}=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _installed(dist: metadata.Distribution) -> metadata.Distribution:
    """``dist``, checked to be the distribution whose files this process runs."""
    import veo_edge

    running = Path(veo_edge.__file__).resolve()
    recorded = Path(str(dist.locate_file("veo_edge/__init__.py"))).resolve()
    if running != recorded or not dist.files:
        raise PackagingError(
            f"the running veo-edge ({running.parent}) is not the installed distribution {DIST} "
            f"{dist.version} (its RECORD lists {recorded.parent}); image builds pack the installed "
            "wheel: run veo-edge from the environment it was installed into, or from a checkout"
        )
    return dist


def _wheel_tag(dist: metadata.Distribution) -> str:
    tags = Parser().parsestr(dist.read_text("WHEEL") or "").get_all("Tag") or []
    if not tags:
        raise PackagingError(
            f"the installed {DIST} {dist.version} has no Tag in its WHEEL file; reinstall it from its wheel"
        )
    parts = [t.split("-") for t in tags]
    return "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))


def _members(dist: metadata.Distribution) -> list[tuple[str, Path, bytes]]:
    """(name in the wheel, installed file, its bytes) for each file of the wheel, hashes checked."""
    scripts = {ep.name for ep in dist.entry_points if ep.group in ("console_scripts", "gui_scripts")}
    members = []
    for f in dist.files or []:
        parts = f.parts
        if parts[0] == "..":  # outside site-packages: the console scripts an installer generates
            if f.name in scripts or Path(f.name).stem in scripts:
                continue
            raise PackagingError(
                f"the installed {DIST} has a file outside its site-packages ({f}) that is no console "
                "script; packing the installed wheel cannot carry it: build images from a checkout"
            )
        in_info = parts[0].endswith(".dist-info")
        if "__pycache__" in parts or (in_info and f.name in {"RECORD", *_INSTALLER_FILES}):
            continue
        path = Path(str(f.locate()))
        try:
            data = path.read_bytes()
        except OSError as e:
            raise PackagingError(
                f"the installed {DIST} lacks {f} that its RECORD lists ({e.strerror}); reinstall it "
                f"(`pip install --force-reinstall --no-deps {DIST}=={dist.version}`)"
            ) from e
        if f.hash is not None and _record_hash(data, f.hash.mode) != f"{f.hash.mode}={f.hash.value}":
            raise PackagingError(
                f"the installed {DIST} file {path} differs from its RECORD (changed after install); an "
                f"image carries the installed wheel as installed: reinstall it (`pip install "
                f"--force-reinstall --no-deps {DIST}=={dist.version}`), or build from a checkout"
            )
        members.append((f.as_posix(), path, data))
    return members


def wheel_from_installed(dest: Path) -> Path:
    """The installed veo-edge wheel, packed again from its installed files into ``dest``."""
    try:
        dist = _installed(metadata.distribution(DIST))
    except metadata.PackageNotFoundError as e:
        raise PackagingError(
            f"{DIST} is not installed as a distribution (no {DIST} dist-info on sys.path); install it "
            "(`pip install veo-edge`) or run from a checkout (`pip install -e .`)"
        ) from e
    members = _members(dist)
    infos = {top for top in (name.split("/", 1)[0] for name, _, _ in members) if top.endswith(".dist-info")}
    if len(infos) != 1:
        raise PackagingError(f"the installed {DIST} lists {len(infos)} .dist-info folders: {sorted(infos)}")
    info = infos.pop()
    # the wheel's own order: the contents, then the .dist-info, RECORD last
    members.sort(key=lambda m: (m[0].startswith(info + "/"), m[0]))
    out = dest / f"{info.removesuffix('.dist-info')}-{_wheel_tag(dist)}.whl"
    date_time = time.gmtime(max(int(os.environ.get("SOURCE_DATE_EPOCH", _ZIP_EPOCH)), _ZIP_EPOCH))[:6]
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    tmp = out.with_name(f".{out.name}.part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:

        def add(name: str, data: bytes, mode: int) -> None:
            zi = zipfile.ZipInfo(name, date_time=date_time)
            zi.external_attr = (stat.S_IFREG | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)

        for name, path, data in members:
            add(name, data, path.stat().st_mode & 0o755)
            writer.writerow([name, _record_hash(data), len(data)])
        writer.writerow([f"{info}/RECORD", "", ""])
        add(f"{info}/RECORD", record.getvalue().encode(), 0o644)
    tmp.replace(out)
    return out

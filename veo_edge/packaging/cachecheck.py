"""The cache volume before anything runs: only what the image itself writes there, nothing that runs.

``/cache`` is the one writable place of a veo-edge container and survives releases, so it is where
someone who once had a foothold (or a shared volume) would leave code for the next start: a ``.pth`` or
``sitecustomize`` in a user site directory, a Python module, a shared library, or a TensorRT engine
(engines can carry plugin code) for the runtime to deserialise. The image no longer puts ``HOME`` there
and runs Python isolated (``-I``), and this check refuses, and reports, every such file before the
server starts (the entrypoint, ``verify IMAGE_ROOT --cache DIR``) and before a deploy starts a release
on the volume (``verify IMAGE --cache VOLUME``, read through the engine without running anything).

Engines are kept per image, in ``engines/<first 16 hex of the image manifest's sha256>/`` (the entrypoint
points ``$VEO_EDGE_ENGINE_CACHE`` there), so a release never loads another release's engines. In its own
directory every engine needs its sidecar (:mod:`veo_edge.engine.cache`), with the recorded size, and a key
naming one of the ONNX files and plugin libraries of the signed manifest; anything else there is refused.
An entry forged with a matching key and size cannot be told from one this image wrote (there is no
secret to sign it with): keep the volume writable by the container's user only, or use a tmpfs.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veo_edge.packaging.streams import buffered

ENGINES = "engines"
CODE_SUFFIXES = (".pth", ".py", ".pyc", ".pyo", ".so", ".egg-link", ".whl", ".egg")
CODE_NAMES = frozenset({"sitecustomize.py", "usercustomize.py", "__init__.py"})
CODE_DIRS = frozenset({"site-packages", "dist-packages", ".local", "__pycache__", "lib", "bin"})
#: what the engine cache writes in an image's directory (veo_edge.engine.cache)
_OWN_FILE = re.compile(r"[A-Za-z0-9._-]+\.(engine|json|cache)$")
_KEY_DIR = re.compile(r"[0-9a-f]{16}$")
_SMALL = 1 << 20


@dataclass(frozen=True)
class Item:
    rel: str  # '/'-separated, relative to the volume's root
    kind: str  # file | dir | link | other
    size: int = 0
    data: bytes | None = None  # the content of small .json files


def key_dir(manifest_sha256: str) -> str:
    """The engine directory of one image, relative to the volume root."""
    return f"{ENGINES}/{manifest_sha256[:16]}"


def scan_dir(root: Path) -> list[Item]:
    items: list[Item] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames) + sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                items.append(Item(rel, "link"))
            elif stat.S_ISDIR(st.st_mode):
                items.append(Item(rel, "dir"))
            elif stat.S_ISREG(st.st_mode):
                data = None
                if name.endswith(".json") and st.st_size <= _SMALL:
                    data = Path(full).read_bytes()
                items.append(Item(rel, "file", st.st_size, data))
            else:
                items.append(Item(rel, "other"))
    return items


def scan_tar(chunks: Iterable[bytes], top: str) -> list[Item]:
    """The same from the engine's archive of the volume (members start with ``top/``)."""
    items: list[Item] = []
    with tarfile.open(fileobj=buffered(chunks), mode="r|") as tar:
        for m in tar:
            rel = m.name[len(top) :].lstrip("/") if m.name.startswith(top) else m.name
            if not rel:
                continue
            if m.issym() or m.islnk():
                items.append(Item(rel, "link"))
            elif m.isdir():
                items.append(Item(rel, "dir"))
            elif m.isfile():
                data = None
                if rel.endswith(".json") and m.size <= _SMALL:
                    f = tar.extractfile(m)
                    data = f.read() if f is not None else None
                items.append(Item(rel, "file", m.size, data))
            else:
                items.append(Item(rel, "other"))
    return items


def _is_code(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    return (
        name in CODE_NAMES
        or name.endswith(CODE_SUFFIXES)
        or ".so." in name
        or any(p in CODE_DIRS for p in parts[:-1])
    )


def problems(items: list[Item], manifest: dict[str, Any], manifest_sha256: str) -> list[str]:
    """What on the volume must not be there, one phrase each (empty: the volume is clean)."""
    files = manifest.get("files") or {}
    models = {f["sha256"] for p, f in files.items() if p.startswith("model/") and p.endswith(".onnx")}
    plugins = {f["sha256"] for p, f in files.items() if p.startswith("lib/") and ".so" in p}
    own = key_dir(manifest_sha256)
    by_rel = {i.rel: i for i in items}
    out: list[str] = []
    for item in items:
        rel = item.rel
        parts = rel.split("/")
        if item.kind in ("link", "other"):
            out.append(f"{rel} is a {'link' if item.kind == 'link' else 'special file'} (planted)")
        elif (item.kind == "dir" and parts[-1] in CODE_DIRS) or (item.kind == "file" and _is_code(rel)):
            out.append(f"{rel} is code (planted: Python, .pth and shared libraries never belong there)")
        elif parts[0] == "lost+found" or rel == ENGINES:
            continue
        elif parts[0] != ENGINES:
            out.append(f"{rel} is not something veo-edge writes on its cache volume")
        elif len(parts) == 2:
            if item.kind != "dir" or not _KEY_DIR.fullmatch(parts[1]):
                out.append(f"{rel} lies outside any image's engine directory (planted)")
        elif rel.startswith(own + "/"):
            out.extend(_own_entry(item, by_rel, models, plugins))
    # name the planted files first; a directory only when nothing under it is named already
    dirs = {i.rel for i in items if i.kind == "dir"}
    files = [m for m in out if m.split(" ", 1)[0] not in dirs]
    named = [m.split(" ", 1)[0] for m in files]
    lone_dirs = [
        m
        for m in out
        if m.split(" ", 1)[0] in dirs and not any(n.startswith(m.split(" ", 1)[0] + "/") for n in named)
    ]
    return sorted(files) + sorted(lone_dirs)


def _own_entry(item: Item, by_rel: dict[str, Item], models: set, plugins: set) -> list[str]:
    rel = item.rel
    if item.kind != "file" or rel.count("/") != 2 or not _OWN_FILE.fullmatch(rel.rsplit("/", 1)[1]):
        return [f"{rel} is not something the engine cache writes"]
    if not rel.endswith(".engine"):
        return []
    sidecar = by_rel.get(rel[: -len(".engine")] + ".json")
    if sidecar is None or sidecar.data is None:
        return [f"engine {rel} has no sidecar recording what it was built from (planted)"]
    try:
        meta = json.loads(sidecar.data)
        key = meta["key"]
        model, plugin, size = key["model_sha256"], key["plugin_sha256"], meta["bytes"]
    except (ValueError, KeyError, TypeError):
        return [f"engine {rel}: its sidecar is not the engine cache's (planted)"]
    if model not in models:
        return [f"engine {rel} was built from ONNX sha256 {model}, not from this image's model (planted)"]
    if plugin is not None and plugin not in plugins:
        return [f"engine {rel} names plugin library sha256 {plugin}, not this image's (planted)"]
    if size != item.size:
        return [f"engine {rel} is {item.size} bytes, its sidecar records {size} (modified)"]
    return []

"""Images derived from the signed session image the way an attacker would change it, each cheap: one
Dockerfile instruction on top (no new layer, or one tiny one), or the base layer swapped by rewriting the
engine's own ``docker save`` stream on its way back into ``docker load`` (the layer gets an
``/etc/ld.so.preload``; nothing under /opt/veo-edge changes, so only the image ID can tell)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from veo_edge.packaging.streams import buffered

#: what each derived image changes (one Dockerfile instruction on top of the signed image)
CHANGES = {
    "entrypoint": 'ENTRYPOINT ["/bin/sh", "-c", "echo owned"]',
    "ld_preload": "ENV LD_PRELOAD=/cache/evil.so",
    "pythonpath": "ENV PYTHONPATH=/cache/pylib",
    "user": "USER 0",
    "layer": "COPY evil.txt /usr/local/share/evil.txt",
    "healthcheck": 'HEALTHCHECK CMD ["/bin/true"]',
}
#: what the refusal names as changed, for each of CHANGES (the config fields that differ)
CHANGED = {
    "entrypoint": "Entrypoint changed",
    "ld_preload": "Env LD_PRELOAD added",
    "pythonpath": "Env PYTHONPATH added",
    "user": "User changed",
    "layer": "1 layer added",
    "healthcheck": "Healthcheck changed",
}


def derive(engine, base: str, tag: str, instruction: str) -> str:
    ctx = Path(tempfile.mkdtemp(prefix="veo-tamper-"))
    try:
        (ctx / "evil.txt").write_text("not from the build\n")
        (ctx / "Dockerfile").write_text(f"FROM {base}\n{instruction}\n")
        r = engine.docker("build", "-q", "-t", tag, str(ctx), check=False)
        assert r.returncode == 0, r.stderr
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return tag


def _append(layer: bytes, name: str, data: bytes) -> bytes:
    buf = io.BytesIO(layer)
    with tarfile.open(fileobj=buf, mode="a") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def swap_base_layer(client, src: str, tag: str) -> str:
    """``src`` with its first (base) layer replaced by the same layer plus ``/etc/ld.so.preload``.

    ``docker save`` archives a directory tree in name order: per layer ``<id>/json`` (the base layer's
    names no parent) before ``<id>/layer.tar``, and the config before ``manifest.json``; ``docker load``
    reads the whole archive before it looks at any of it, so the config can follow the layers here."""
    src_id = client.images.get(src).id
    state: dict = {"base": None}

    def rewritten() -> Iterator[bytes]:
        pipe = _Pipe()
        with (
            tarfile.open(fileobj=pipe, mode="w|") as out,
            tarfile.open(fileobj=buffered(client.api.get_image(src_id)), mode="r|") as tar,
        ):
            for m in tar:
                if not m.isfile():
                    out.addfile(m)
                    continue
                f = tar.extractfile(m)
                top, _, leaf = m.name.partition("/")
                if leaf == "json" and "parent" not in json.loads(data := f.read()):
                    state["base"] = top
                    f = io.BytesIO(data)
                elif leaf == "json":
                    f = io.BytesIO(data)
                elif leaf == "layer.tar" and top == state["base"]:
                    data = _append(f.read(), "etc/ld.so.preload", b"/cache/evil.so\n")
                    state["diff_id"] = "sha256:" + hashlib.sha256(data).hexdigest()
                    m.size, f = len(data), io.BytesIO(data)
                elif m.name.endswith(".json") and not leaf and m.name != "manifest.json":
                    state["config"] = (m, json.loads(f.read()))
                    continue
                elif m.name == "manifest.json":
                    cm, config = state["config"]
                    config["rootfs"]["diff_ids"][0] = state["diff_id"]
                    data = json.dumps(config).encode()
                    cm.size = len(data)
                    out.addfile(cm, io.BytesIO(data))
                    manifest = json.loads(f.read())
                    manifest[0]["RepoTags"] = [tag]
                    data = json.dumps(manifest).encode()
                    m.size, f = len(data), io.BytesIO(data)
                elif m.name == "repositories":
                    continue
                out.addfile(m, f)
                yield pipe.take()
        yield pipe.take()

    for line in client.api.load_image(rewritten()):
        assert not (isinstance(line, dict) and line.get("error")), line
    return tag


class _Pipe(io.RawIOBase):
    def __init__(self) -> None:
        self.buf = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.buf += b
        return len(b)

    def take(self) -> bytes:
        out, self.buf = bytes(self.buf), bytearray()
        return out

"""The image manifest and its DSSE/Ed25519 signature, on real files: any changed, added, removed or
re-pointed file, a changed manifest, another key or a stripped signature is refused, with one line
naming what differs. The tar path (``veo-edge verify IMAGE``) sees what the disk path sees."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from veo_edge.errors import ImageTrustError, PackagingError
from veo_edge.packaging import manifest as im
from veo_edge.packaging import signing


def _key_file(tmp_path: Path, name: str = "key.pem", key=None) -> Path:
    key = key or ed25519.Ed25519PrivateKey.generate()
    p = tmp_path / name
    p.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return p


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "veo-edge"
    (root / "model" / "openvino").mkdir(parents=True)
    (root / "model" / "openvino" / "model.bin").write_bytes(bytes(range(256)) * 4)
    (root / "model" / "manifest.json").write_text('{"a": 1}\n')
    (root / "bin").mkdir()
    (root / "bin" / "entrypoint.sh").write_text("#!/bin/sh\nexec true\n")
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "python3").symlink_to("/usr/bin/python3")
    return root


def _seal(root: Path, key_path: Path | None) -> dict:
    entries, _ = im.scan_dir(root)
    info = {"target": "cpu"}
    private = signing.load_private_key(key_path) if key_path else None
    if private is not None:
        info["signing_key"] = signing.fingerprint(private.public_key())
    raw = im.make_manifest(entries, info)
    (root / "trust").mkdir()
    (root / im.MANIFEST_FILE).write_bytes(raw)
    if private is not None:
        (root / im.SIGNATURE_FILE).write_text(json.dumps(signing.sign(raw, private)))
        (root / im.PUBKEY_FILE).write_bytes(signing.public_pem(private.public_key()))
    return info


def test_signed_root_verifies_and_pins_the_key(tmp_path: Path) -> None:
    root, key = _root(tmp_path), _key_file(tmp_path)
    info = _seal(root, key)
    report = im.verify_root(root)
    assert report["ok"] and report["files"] == 3 and report["symlinks"] == 1
    assert report["signed_by"] == info["signing_key"]
    # pinned by fingerprint and by the public key's PEM file
    assert im.verify_root(root, trusted_key=info["signing_key"])["pinned_key"] == info["signing_key"]
    assert im.verify_root(root, trusted_key=str(root / im.PUBKEY_FILE))["ok"]


def test_fingerprint_is_the_sha256_of_the_spki_der(tmp_path: Path) -> None:
    import hashlib

    key = ed25519.Ed25519PrivateKey.generate().public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert signing.fingerprint(key) == "sha256:" + hashlib.sha256(der).hexdigest()


@pytest.mark.parametrize(
    "tamper, match",
    [
        (
            lambda r: _flip_byte(r / "model" / "openvino" / "model.bin"),
            r"model/openvino/model.bin has sha256",
        ),
        (
            lambda r: (r / "model" / "extra.onnx").write_bytes(b"x"),
            r"model/extra.onnx is not in the manifest",
        ),
        (lambda r: (r / "bin" / "entrypoint.sh").unlink(), r"bin/entrypoint.sh is missing"),
        (lambda r: _repoint(r / "venv" / "bin" / "python3"), r"symlink venv/bin/python3 -> /usr/bin/python3"),
    ],
    ids=["one-byte", "added", "removed", "symlink"],
)
def test_any_changed_file_is_refused(tmp_path: Path, tamper, match: str) -> None:
    root = _root(tmp_path)
    _seal(root, _key_file(tmp_path))
    tamper(root)
    with pytest.raises(ImageTrustError, match=match):
        im.verify_root(root)


def _flip_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[100] ^= 0x01
    p.write_bytes(bytes(data))


def _repoint(p: Path) -> None:
    p.unlink()
    p.symlink_to("/tmp/evil-python")


def test_changed_manifest_breaks_the_signature(tmp_path: Path) -> None:
    root = _root(tmp_path)
    _seal(root, _key_file(tmp_path))
    # re-hash a tampered file into the manifest: the signature no longer covers it
    _flip_byte(root / "model" / "openvino" / "model.bin")
    m = json.loads((root / im.MANIFEST_FILE).read_bytes())
    entries, _ = im.scan_dir(root)
    m["files"]["model/openvino/model.bin"]["sha256"] = entries["model/openvino/model.bin"].sha256
    (root / im.MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(ImageTrustError, match="signed payload is not the image manifest"):
        im.verify_root(root)


def test_re_signed_by_another_key_is_refused_when_the_key_is_pinned(tmp_path: Path) -> None:
    root, ours, theirs = _root(tmp_path), _key_file(tmp_path, "ours.pem"), _key_file(tmp_path, "theirs.pem")
    pinned = signing.fingerprint(signing.load_private_key(ours).public_key())
    _seal(root, theirs)
    assert im.verify_root(root)["ok"]  # self-consistent, so only a pin can tell
    with pytest.raises(ImageTrustError, match="not by the trusted key"):
        im.verify_root(root, trusted_key=pinned)


def test_signature_by_another_key_than_the_baked_one_is_refused(tmp_path: Path) -> None:
    root, key, other = _root(tmp_path), _key_file(tmp_path, "a.pem"), _key_file(tmp_path, "b.pem")
    _seal(root, key)
    raw = (root / im.MANIFEST_FILE).read_bytes()
    forged = signing.sign(raw, signing.load_private_key(other))
    # keep the keyid the verifier looks for, with the other key's signature bytes
    good = json.loads((root / im.SIGNATURE_FILE).read_text())
    forged["signatures"][0]["keyid"] = good["signatures"][0]["keyid"]
    (root / im.SIGNATURE_FILE).write_text(json.dumps(forged))
    with pytest.raises(ImageTrustError, match="signature does not verify"):
        im.verify_root(root)


def test_stripped_signature_and_unsigned_image_under_a_pin(tmp_path: Path) -> None:
    root = _root(tmp_path)
    info = _seal(root, _key_file(tmp_path))
    (root / im.SIGNATURE_FILE).unlink()
    with pytest.raises(ImageTrustError, match="has no signature"):
        im.verify_root(root)
    unsigned = _root(tmp_path / "u")
    _seal(unsigned, None)
    # refused by default; VEO_EDGE_ALLOW_UNSIGNED=1 (deploy --allow-unsigned) lets it start, never a pin
    with pytest.raises(ImageTrustError, match=r"is unsigned; build it with .* VEO_EDGE_ALLOW_UNSIGNED=1"):
        im.verify_root(unsigned)
    assert im.verify_root(unsigned, allow_unsigned=True)["signed_by"] is None
    with pytest.raises(ImageTrustError, match="is unsigned, but key sha256:"):
        im.verify_root(unsigned, trusted_key=info["signing_key"], allow_unsigned=True)


def test_no_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageTrustError, match=r"has no trust/image-manifest\.json"):
        im.verify_root(_root(tmp_path))


def test_tar_stream_sees_what_the_disk_sees(tmp_path: Path) -> None:
    root = _root(tmp_path)
    _seal(root, _key_file(tmp_path))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(root, arcname="veo-edge")
    data = buf.getvalue()
    chunks = (data[i : i + 7777] for i in range(0, len(data), 7777))  # chunk edges anywhere
    entries, trust = im.scan_tar(chunks, "veo-edge")
    assert (entries, trust) == im.scan_dir(root)
    assert im.check(entries, trust, "tar")["ok"]


def test_sign_key_must_be_a_readable_ed25519_pem(tmp_path: Path) -> None:
    rsa_key = _key_file(tmp_path, "rsa.pem", rsa.generate_private_key(public_exponent=65537, key_size=2048))
    with pytest.raises(PackagingError, match="expected an Ed25519 key"):
        signing.load_private_key(rsa_key)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    with pytest.raises(PackagingError, match="openssl genpkey -algorithm ed25519"):
        signing.load_private_key(junk)
    with pytest.raises(PackagingError, match="cannot be read"):
        signing.load_private_key(tmp_path / "absent.pem")


def _tar_of(members) -> list[bytes]:
    """An archive as the engine streams one: (TarInfo, bytes or None) members, in chunks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    data = buf.getvalue()
    return [data[i : i + 4096] for i in range(0, len(data), 4096)]


def _member(name: str, data: bytes | None = None, link: str | None = None) -> tuple:
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.LNKTYPE, link
    else:
        info.size = len(data or b"")
    return info, data


def test_hard_links_in_the_archive_count_as_the_files_they_are_on_disk(tmp_path: Path) -> None:
    """On disk a hard link is one more regular file; the engine's archive of the same tree carries it as a
    link to a member. Both scans must see the same entries, and a link the archive cannot resolve (to a
    member outside it) must fail the check instead of vanishing."""
    import os

    root = _root(tmp_path)
    os.link(root / "bin" / "entrypoint.sh", root / "bin" / "entrypoint-copy.sh")
    _seal(root, _key_file(tmp_path))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(root, arcname="veo-edge")
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
        assert any(m.islnk() for m in tar)
    entries, trust = im.scan_tar([buf.getvalue()], "veo-edge")
    assert (entries, trust) == im.scan_dir(root)
    assert entries["bin/entrypoint-copy.sh"].sha256 == entries["bin/entrypoint.sh"].sha256
    assert im.check(entries, trust, "tar")["ok"]

    # an added hard link to a file elsewhere in the image (outside the root): never silently skipped
    chunks = _tar_of([_member("veo-edge/bin/sneaky", link="usr/bin/python3")])
    entries, _ = im.scan_tar(chunks, "veo-edge")
    assert entries["bin/sneaky"].sha256 is None and "hard link" in entries["bin/sneaky"].target
    with pytest.raises(ImageTrustError, match=r"bin/sneaky is not in the manifest"):
        im.check({**im.scan_dir(root)[0], **entries}, im.scan_dir(root)[1], "tar")


def test_the_cache_volume_check_names_planted_code_and_engines(tmp_path: Path) -> None:
    from veo_edge.packaging import cachecheck

    manifest = {"files": {"model/model.onnx": {"sha256": "a" * 64, "bytes": 10},
                          "lib/libveo_edge_plugins.so": {"sha256": "b" * 64, "bytes": 10}}}  # fmt: skip
    digest = "c" * 64
    own = cachecheck.key_dir(digest)
    vol = tmp_path / "cache"
    (vol / own).mkdir(parents=True)
    (vol / "engines" / ("d" * 16)).mkdir()  # another release's engines: left alone
    (vol / "engines" / ("d" * 16) / "old.engine").write_bytes(b"x" * 5)
    good = {"format": 1, "key": {"model_sha256": "a" * 64, "plugin_sha256": "b" * 64}, "bytes": 4}
    (vol / own / "vit-fp16.engine").write_bytes(b"eeee")
    (vol / own / "vit-fp16.json").write_text(json.dumps(good))
    (vol / own / "timing-sm87-trt10.3.cache").write_bytes(b"t")
    assert cachecheck.problems(cachecheck.scan_dir(vol), manifest, digest) == []

    (vol / ".local" / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (vol / ".local" / "lib" / "python3.11" / "site-packages" / "evil.pth").write_text("import os\n")
    (vol / own / "planted.engine").write_bytes(b"zz")  # no sidecar
    (vol / own / "foreign.engine").write_bytes(b"eeee")
    (vol / own / "foreign.json").write_text(
        json.dumps({**good, "key": {**good["key"], "model_sha256": "f" * 64}})
    )
    (vol / "engines" / "loose.engine").write_bytes(b"x")
    (vol / "notes.txt").write_text("hi")
    found = cachecheck.problems(cachecheck.scan_dir(vol), manifest, digest)
    text = " | ".join(found)
    assert ".local/lib/python3.11/site-packages/evil.pth is code" in text
    assert f"engine {own}/planted.engine has no sidecar" in text
    assert f"engine {own}/foreign.engine was built from ONNX sha256 {'f' * 64}" in text
    assert "engines/loose.engine lies outside any image's engine directory" in text
    assert "notes.txt is not something veo-edge writes" in text
    assert not any(p.startswith(".local ") or p.startswith(".local/lib ") for p in found)  # files named first
    # the archive the engine streams of the same volume reads the same
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(vol, arcname="cache")
    assert cachecheck.problems(cachecheck.scan_tar([buf.getvalue()], "cache"), manifest, digest) == found


def test_the_local_signing_key_is_made_once_owner_only_and_is_the_default_pin(tmp_path, monkeypatch) -> None:
    from veo_edge.packaging import imagetrust, localkey

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("VEO_EDGE_TRUSTED_KEY", raising=False)
    assert localkey.fingerprint() is None and imagetrust.resolve_pin(None) == (None, "none")
    path, fp, created = localkey.ensure()
    assert created and path == tmp_path / "cfg" / "veo-edge" / "signing-key.pem"
    assert path.stat().st_mode & 0o777 == 0o600
    assert signing.fingerprint(signing.load_private_key(path).public_key()) == fp == localkey.fingerprint()
    assert localkey.ensure() == (path, fp, False)  # once
    assert imagetrust.resolve_pin(None) == (fp, f"the local key {localkey.public_path()}")
    monkeypatch.setenv("VEO_EDGE_TRUSTED_KEY", "sha256:" + "0" * 64)  # an explicit pin wins over it
    assert imagetrust.resolve_pin(None)[0] == "sha256:" + "0" * 64
    assert imagetrust.resolve_pin(fp)[0] == fp

"""Finding the TensorRT plugin library and describing it for the manifest."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from veo_edge.engine import plugin_library
from veo_edge.engine.plugin_library import PluginLibrary, find_plugin_library
from veo_edge.errors import BackendUnavailableError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(plugin_library.ENV_VAR, raising=False)


def _fake_lib(d: Path, content: bytes = b"\x7fELF not really") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / plugin_library.LIB_NAME
    p.write_bytes(content)
    return p


def test_found_in_search_dirs_with_checksum(tmp_path: Path) -> None:
    lib = _fake_lib(tmp_path / "b")
    got = find_plugin_library([tmp_path / "a", tmp_path / "b"])
    assert got == PluginLibrary(
        lib.resolve(), hashlib.sha256(lib.read_bytes()).hexdigest(), lib.stat().st_size
    )
    assert got.to_manifest() == {"path": str(lib.resolve()), "sha256": got.sha256, "bytes": got.bytes}


def test_absent_is_none(tmp_path: Path) -> None:
    assert find_plugin_library([tmp_path]) is None


def test_env_var_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_lib(tmp_path / "build")
    chosen = _fake_lib(tmp_path / "env", b"other")
    monkeypatch.setenv(plugin_library.ENV_VAR, str(chosen))
    assert find_plugin_library([tmp_path / "build"]).path == chosen.resolve()


def test_env_var_naming_no_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin_library.ENV_VAR, str(tmp_path / "missing.so"))
    with pytest.raises(
        BackendUnavailableError, match=r"VEO_EDGE_PLUGIN_LIB is set to .*missing\.so, which is not"
    ):
        find_plugin_library([tmp_path])


def test_frozen(tmp_path: Path) -> None:
    got = find_plugin_library([_fake_lib(tmp_path).parent])
    with pytest.raises(AttributeError):
        got.bytes = 0  # type: ignore[misc]

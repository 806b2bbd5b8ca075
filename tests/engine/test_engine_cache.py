"""The engine cache: what a key covers, and every way an entry is refused (rebuilt, never trusted)."""

import dataclasses
import json

import pytest

from veo_edge.engine.cache import (
    CacheEntry,
    ChoiceRecord,
    EngineKey,
    cache_dir,
    read_choices,
    timing_cache_path,
)
from veo_edge.engine.selection import Decision, Measurement

KEY = EngineKey(
    gpu_name="Orin (nvgpu)",
    compute_capability="8.7",
    trt_version="10.3.0",
    plugin_sha256="ab" * 32,
    model_sha256="cd" * 32,
    precision="fp16",
    max_batch=8,
    opt_batch=8,
)


@pytest.mark.parametrize(
    "change",
    [
        {"gpu_name": "NVIDIA A100-SXM4-40GB"},
        {"compute_capability": "8.0"},
        {"trt_version": "10.3.1"},
        {"plugin_sha256": "ef" * 32},
        {"plugin_sha256": None},
        {"model_sha256": "00" * 32},
        {"precision": "fp32"},
        {"max_batch": 4},
    ],
)
def test_every_key_field_changes_the_entry(change):
    other = dataclasses.replace(KEY, **change)
    assert other.digest() != KEY.digest() and other.filename("vit-tiny") != KEY.filename("vit-tiny")


def test_filename_is_readable_and_stable():
    name = KEY.filename("vit tiny/x")
    assert name.startswith("vit-tiny-x-fp16-sm87-trt10.3.0-") and name.endswith(".engine")
    assert name == KEY.filename("vit tiny/x")


def test_entry_round_trip_and_refusals(tmp_path):
    entry = CacheEntry.for_key(tmp_path, "vit-tiny", KEY)
    assert entry.check(KEY).startswith("no cached engine at ")
    entry.write(KEY, b"serialized-engine", device_memory_size=1234)
    assert entry.check(KEY) is None
    assert entry.read_meta()["device_memory_size"] == 1234

    other = dataclasses.replace(KEY, trt_version="10.3.1", precision="fp32")
    foreign = CacheEntry(entry.engine, entry.sidecar)  # same files, asked for another key
    assert foreign.check(other) == "cached engine was built for another precision, trt_version"

    entry.engine.write_bytes(b"serialized-engin")  # truncated
    assert "does not match its recorded checksum" in entry.check(KEY)
    entry.engine.write_bytes(b"serialized-engine")
    entry.sidecar.write_text("{not json")
    assert "is missing or unreadable" in entry.check(KEY)
    entry.sidecar.write_text(json.dumps({"format": 0}))
    assert "has format 0, expected 1" in entry.check(KEY)


def test_cache_locations(tmp_path, monkeypatch):
    monkeypatch.delenv("VEO_EDGE_ENGINE_CACHE", raising=False)
    assert cache_dir(tmp_path) == tmp_path / "engines"
    monkeypatch.setenv("VEO_EDGE_ENGINE_CACHE", str(tmp_path / "c"))
    assert cache_dir(tmp_path) == tmp_path / "c"
    assert timing_cache_path(tmp_path, KEY).name == "timing-sm87-trt10.3.0.cache"


def test_a_choice_is_read_back_only_for_the_same_pair_of_engines(tmp_path):
    plain = dataclasses.replace(KEY, plugin_sha256=None, model_sha256="11" * 32)
    decision = Decision(
        "fastest", "plain", "the plugin engine is not faster at batch 8",
        {"plain": Measurement("plain", {1: 1.0, 8: 3.0}, 1e-5, 4.0),
         "plugins": Measurement("plugins", {1: 0.9, 8: 3.5}, 2e-5, 4.0)},
        5e-5,
    )  # fmt: skip
    record = ChoiceRecord.for_keys(tmp_path, "vit-tiny", plain, KEY)
    assert record.read(plain, KEY) is None  # nothing recorded yet
    record.write(plain, KEY, decision, batches=[1, 8], warmup=10, reps=50)
    assert record.read(plain, KEY) == decision
    # another plugin library or model: another record, and the old one does not answer for it
    other = dataclasses.replace(KEY, plugin_sha256="ef" * 32)
    assert ChoiceRecord.for_keys(tmp_path, "vit-tiny", plain, other).path != record.path
    assert record.read(plain, other) is None
    [shown] = read_choices(tmp_path, "vit-tiny")
    assert shown["decision"]["chosen"] == "plain" and shown["reps"] == 50
    record.path.write_text("{torn")
    assert record.read(plain, KEY) is None and read_choices(tmp_path, "vit-tiny") == []

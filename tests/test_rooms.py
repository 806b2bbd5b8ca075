"""The house's rooms stay small (issue 31): no source module (veo_edge/, plugins/ outside their tests)
over 400 lines, no test or bench file over 600. A file that grows past its bound is split by
responsibility, not cut in half."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_MAX, TEST_MAX = 400, 600
SUFFIXES = {".py", ".cpp", ".cu", ".h", ".cuh"}


def _over(paths, bound: int) -> list[str]:
    sizes = ((p, p.read_bytes().count(b"\n")) for p in paths if p.suffix in SUFFIXES and p.is_file())
    return [f"{p.relative_to(ROOT)}: {n} lines" for p, n in sorted(sizes) if n > bound]


def test_source_modules_stay_under_400_lines() -> None:
    plugins = [p for p in (ROOT / "plugins").rglob("*") if "tests" not in p.relative_to(ROOT).parts]
    over = _over([*(ROOT / "veo_edge").rglob("*"), *plugins], SOURCE_MAX)
    assert not over, f"over {SOURCE_MAX} lines (split by responsibility): {over}"


def test_tests_and_bench_stay_under_600_lines() -> None:
    tests = [
        *(ROOT / "tests").rglob("*"),
        *(ROOT / "plugins").rglob("tests/**/*"),
        *(ROOT / "bench").rglob("*"),
    ]
    over = _over(tests, TEST_MAX)
    assert not over, f"over {TEST_MAX} lines (split by responsibility): {over}"

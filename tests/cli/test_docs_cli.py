"""The docs cannot drift: docs/cli.md is what typer generates from the app, README.md stays a front door,
and every relative link in README.md and docs/*.md points at a file of the checkout."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CLI_DOC = DOCS / "cli.md"
README_MAX_LINES = 250

#: typer's own generator; the tests below run exactly this, into a temporary file
REGENERATE = [
    "-m",
    "typer",
    "veo_edge.cli.main",
    "utils",
    "docs",
    "--name",
    "veo-edge",
    "--title",
    "veo-edge CLI reference",
]
REGENERATE_HINT = (
    ".venv/bin/python " + " ".join(f'"{a}"' if " " in a else a for a in REGENERATE) + " --output docs/cli.md"
)

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def _relative_links(md: Path) -> list[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", md.read_text(encoding="utf-8")))
    links = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s)://, mailto:, an anchor on the same page
        links.append(target.split("#", 1)[0])
    return links


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_cli_reference_is_generated_from_the_app(tmp_path: Path) -> None:
    out = tmp_path / "cli.md"
    subprocess.run(
        [sys.executable, *REGENERATE, "--output", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert CLI_DOC.is_file(), f"docs/cli.md is missing; generate it with: {REGENERATE_HINT}"
    assert out.read_text(encoding="utf-8") == CLI_DOC.read_text(encoding="utf-8"), (
        f"docs/cli.md differs from the CLI; regenerate it with: {REGENERATE_HINT}"
    )


def test_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, expected at most {README_MAX_LINES}: move the detail into a docs/ page"
    )


def test_readme_links_every_docs_page() -> None:
    linked = {(README.parent / t).resolve() for t in _relative_links(README)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md does not link these docs pages: {missing}; add them to 'Where to go next'"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files(page: Path) -> None:
    broken = [t for t in _relative_links(page) if t and not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"

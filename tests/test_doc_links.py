"""Every relative link in the checkout's markdown (README, the kernel's README, RESULTS,
PROVENANCE, the notes, the runs' own notes) reaches a file of the checkout, and every #anchor a
heading of its target (GitHub's anchors), so a renamed note, a retitled section or a link written
from the wrong folder fails here, not in a reader's browser."""
import functools
import os
import re
from pathlib import Path

import pytest

from suite.report.document import github_anchor
from suite.report.readme import MARKDOWN_LINK

ROOT = Path(__file__).resolve().parents[1]


def _markdown_files() -> list[Path]:
    """Every .md of the checkout outside hidden folders (.venv, .nox, .git), virtual
    environments and build outputs: not ours."""
    skipped = {"build", "dist", "__pycache__", "venv", "site-packages"}
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in skipped]
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


DOCS = _markdown_files()
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (neither renders a link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


@functools.cache  # a note linked many times is read once
def anchors(path: Path) -> set[str]:
    """A markdown file's heading anchors as GitHub makes them (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    for line in _prose(path.read_text(encoding="utf-8")).splitlines():
        m = HEADING.match(line)
        if m:
            slug = github_anchor(m.group(1).replace("`", ""))
            seen[slug] = seen.get(slug, -1) + 1
    return {s if k == 0 else f"{s}-{k}" for s, n in seen.items() for k in range(n + 1)}


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in MARKDOWN_LINK.findall(_prose(doc.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_a_heading(doc):
    assert broken_links(doc) == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# A title, with punctuation (x–y)\n\n## Twice\n\n## Twice\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](a.md#a-title-with-punctuation-xy) [ok](a.md#twice-1) [ok](#local)\n"
                   "[gone](b.md) [bad](a.md#a-title) `[code](c.md)` [web](https://x.org/y)\n"
                   "## Local\n")
    assert broken_links(doc) == ["b.md: no such file",
                                 "a.md#a-title: no heading with that anchor in a.md"]

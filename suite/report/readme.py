"""Where the generated tables go: README.md (the headline blocks, suite/report/headline.py) and
results/RESULTS.md (every full table), each between ``<!-- results:<section>:start -->`` and
``<!-- results:<section>:end -->`` markers, never typed by hand."""
from __future__ import annotations

import os
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
RESULTS_DOC = ROOT / "results" / "RESULTS.md"


def rebase_links(text: str, doc: Path) -> str:
    """Markdown links to repository paths (as the report prints them, relative to the
    repository's root) made relative to ``doc``'s folder, so they work inside results/."""
    folder = doc.resolve().parent
    if not folder.is_relative_to(ROOT):  # a document outside the checkout: leave links alone
        return text

    def rebase(match):
        target = match.group(1)
        if re.match(r"^[a-z]+:|^#|^/", target):
            return match.group(0)
        return f"]({Path(os.path.relpath(ROOT / target, folder)).as_posix()})"

    return re.sub(r"\]\(([^)\s]+)\)", rebase, text)


def update_markers(text: str, section: str, path) -> None:
    """Replace what lies between the section's markers in ``path`` with ``text`` (its links
    rebased to the document's folder)."""
    path = Path(path)
    text = rebase_links(text, path)
    start, end = f"<!-- results:{section}:start -->", f"<!-- results:{section}:end -->"
    doc = path.read_text()
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(doc):
        raise ValueError(f"{path} has no '{start}' ... '{end}' markers")
    path.write_text(pattern.sub(lambda _: f"{start}\n{text}\n{end}", doc))


def update_readme(text: str, section: str, readme=README) -> None:
    update_markers(text, section, readme)

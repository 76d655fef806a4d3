"""The README stays a newcomer's page: short, and every document it moved out is linked and
exists; every result file is in the results index."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def links(path: Path) -> set[str]:
    return {m.group(1) for m in LINK.finditer(path.read_text()) if "://" not in m.group(1)}


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) < 300
    targets = links(readme)
    assert all((REPO / t).exists() for t in targets), [t for t in targets if not (REPO / t).exists()]
    docs = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert docs <= targets, f"docs not linked from the README: {sorted(docs - targets)}"


def test_every_result_file_is_in_the_results_index() -> None:
    results = REPO / "load/results"
    indexed = links(results / "README.md")
    missing = [p.name for p in results.glob("*.md") if p.name != "README.md" and p.name not in indexed]
    assert missing == []
    docs_links = {t for d in (REPO / "docs").glob("*.md") for t in links(d)}
    assert all((REPO / "docs" / t).resolve().exists() for t in docs_links if not t.startswith("/"))

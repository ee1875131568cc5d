"""Every relative link in the README and docs/ reaches a file, and a heading of it when it names one: docs move
between files and headings change, and a link that no longer lands is found here, not by a reader. Mentions of a
doc's heading in code (`docs/how-it-works.md#aiming` in a help text) are held to the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
MENTION = re.compile(r"\bdocs/([\w.-]+\.md)#([\w-]+)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*#*$", re.M)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", doc.read_text())):
        base = slug(heading)
        seen[base] = seen.get(base, -1) + 1
        if seen[base]:
            seen[f"{base}-{seen[base]}"] = 0
    return set(seen)


def broken(target: Path, anchor: str) -> str | None:
    if not target.exists():
        return "no such file"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return "no such heading"
    return None


@pytest.mark.parametrize("doc", DOCS, ids=[doc.name for doc in DOCS])
def test_every_relative_link_lands(doc: Path) -> None:
    problems = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"[a-z][a-z+.-]*:", target):
            continue
        path, _, anchor = target.partition("#")
        problem = broken((doc.parent / path) if path else doc, anchor)
        if problem:
            problems.append(f"{target}: {problem}")
    assert problems == []


def test_every_mention_of_a_docs_heading_lands() -> None:
    sources = [*DOCS, *sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
    problems = [
        f"{source.relative_to(ROOT)}: docs/{name}#{anchor}: {problem}"
        for source in sources
        for name, anchor in MENTION.findall(source.read_text())
        if (problem := broken(ROOT / "docs" / name, anchor))
    ]
    assert problems == []


def test_a_moved_heading_is_caught(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("# A\n\n## The `draw`: families, weights\n\n## Speed\n\n## Speed\n\n```\n## not a heading\n```\n")
    assert anchors(doc) == {"a", "the-draw-families-weights", "speed", "speed-1"}
    assert broken(doc, "the-draw-families-weights") is None
    assert broken(doc, "not-a-heading") == "no such heading"
    assert broken(tmp_path / "b.md", "") == "no such file"

"""The project's written pages, as the tests that run or check what they say read them: README.md and every
page of the docs site (docs/*.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pages() -> list[Path]:
    """README.md, then the docs pages in name order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def all_text() -> str:
    """Every page's text, one after the other."""
    return "\n".join(p.read_text(encoding="utf-8") for p in pages())


def section(title: str) -> str:
    """The text under the heading that starts with ``title`` (at any level, on any page), up to the next
    heading of the same or a higher level. Exactly one heading may match."""
    found = []
    for path in pages():
        lines = path.read_text(encoding="utf-8").split("\n")
        fence = False
        heads = []
        for i, line in enumerate(lines):
            fence = fence != line.startswith("```")
            if not fence and (m := re.match(r"^(#{1,6}) (.*)$", line)):
                heads.append((i, len(m.group(1)), m.group(2)))
        for k, (i, level, text) in enumerate(heads):
            if text.startswith(title):
                end = next((j for j, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
                found.append("\n".join(lines[i + 1 : end]))
    assert len(found) == 1, f"{len(found)} headings start with {title!r}"
    return found[0]

"""User text inside Markdown that others read (the app's views, an export's model card): shown as the
characters typed, never as markup. No torch here: the app imports it (:mod:`app.text`).

:func:`md_text` for a name or other short text placed after one's own words (a run name in a heading or a
table cell), :func:`md_code_block` for a text shown verbatim, :func:`md_cell` for a table cell. Each leaves text
without markup as it is.
"""

from __future__ import annotations

import re
from typing import Any

_HTML = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def md_text(value: Any, limit: int = 300) -> str:
    """``value`` as one line of Markdown, placed after the app's own words, that renders as its literal text
    (at most ``limit`` characters of it, then "…"): HTML's ``< > &`` as entities; a backslash before what
    is markup anywhere in a line (``\\ ` * ~ [ ] $``, and ``_`` except between two letters or digits, where
    CommonMark never reads it as emphasis); bare URLs and e-mail addresses broken up (:func:`unlink`); line
    breaks and tabs as spaces. "tiny-shapes" and "my_run" stay as they are."""
    text = " ".join(str(value).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    text = re.sub(r"([\\`*~\[\]$])", r"\\\1", text)
    text = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", text)
    text = "".join(_HTML.get(c, c) for c in text)
    return unlink(text)


def md_cell(value: Any, limit: int = 300) -> str:
    """:func:`md_text` for a GFM table cell: a ``|`` cannot end the cell either."""
    return md_text(value, limit).replace("|", "\\|")


def unlink(text: str) -> str:
    """Break GFM's bare-URL and e-mail autolinks (``https:\\/\\/``, ``www\\.``, ``\\@``)."""
    return text.replace("://", ":\\/\\/").replace("www.", "www\\.").replace("@", "\\@")


def md_code_block(text: str, lang: str = "") -> str:
    """``text`` as a fenced code block (of language ``lang``, one of the writer's) whose fence is longer than
    any run of backticks inside it (so the text cannot close the block and continue as Markdown)."""
    longest, run = 0, 0
    for c in text:
        run = run + 1 if c == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"

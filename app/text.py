"""User text inside the app's Markdown: shown as the characters typed, never as markup.

A run name (shown to every visitor) goes through :func:`md_text` before it is put in a ``gr.Markdown``
(which renders Markdown and HTML, and would fetch ``![x](https://…)`` images or show ``[Owner login](https://…)``
links of another visitor's making); a handler's one-line message, which may quote a refused value, through
:func:`md_message`; a multi-line text shown verbatim (a run's error) goes in :func:`md_code_block`. Each
leaves text without markup as it is, so the API (which returns the Markdown) reads the same words.
"""

from __future__ import annotations

import re
from typing import Any

_HTML = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def md_text(value: Any, limit: int = 300) -> str:
    """``value`` as one line of Markdown, placed after the app's own words, that renders as its literal text
    (at most ``limit`` characters of it, then "…"): HTML's ``< > &`` as entities; a backslash before what
    is markup anywhere in a line (``\\ ` * ~ [ ] $``, and ``_`` except between two letters or digits, where
    CommonMark never reads it as emphasis); bare URLs and e-mail addresses broken up as in
    :func:`md_message`; line breaks and tabs as spaces. "tiny-shapes" and "my_run" stay as they are."""
    text = " ".join(str(value).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    text = re.sub(r"([\\`*~\[\]$])", r"\\\1", text)
    text = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", text)
    text = "".join(_HTML.get(c, c) for c in text)
    return _unlink(text)


def md_message(value: Any, limit: int = 500) -> str:
    """A one-line message that may quote what a visitor sent (a refused value) as Markdown with no link,
    image, HTML or code span of the visitor's making, yet unchanged where it holds none of them (the API
    returns it as text): a backslash goes before a backslash or a backtick, before ``<`` that opens a tag (a letter,
    ``/``, ``!`` or ``?`` after it), and before ``]`` that closes a link's text (``(``, ``[`` or ``:`` after
    it); bare URLs and e-mail addresses are broken up (``https:\\/\\/``, ``www\\.``, ``\\@``) so that GFM
    does not link them. A message starts with the app's own words, so no line-start syntax applies."""
    text = " ".join(str(value).split())
    if len(text) > limit:  # a message never echoes a megabyte back
        text = text[: limit - 1] + "…"
    text = re.sub(r"([\\`])", r"\\\1", text)
    text = re.sub(r"<(?=[A-Za-z/!?])", r"\\<", text)
    text = re.sub(r"\](?=[(\[:])", r"\\]", text)
    return _unlink(text)


def _unlink(text: str) -> str:
    """Break GFM's bare-URL and e-mail autolinks (``https:\\/\\/``, ``www\\.``, ``\\@``)."""
    return text.replace("://", ":\\/\\/").replace("www.", "www\\.").replace("@", "\\@")


def md_code_block(text: str) -> str:
    """``text`` as a fenced code block whose fence is longer than any run of backticks inside it (so the
    text cannot close the block and continue as Markdown)."""
    longest, run = 0, 0
    for c in text:
        run = run + 1 if c == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def cannot_write(folder: Any, exc: OSError) -> str:
    """The one-line Markdown message of a folder that could not be written (read-only, full, …)."""
    return f"**Error:** cannot write {md_text(folder)}: {md_message(exc.strerror or exc)}"

"""User text inside the app's Markdown: shown as the characters typed, never as markup.

A run name, a config value echoed in an error, a Hugging Face username: anything a visitor wrote is passed
through :func:`md_text` before it is put in a ``gr.Markdown`` (which renders Markdown and HTML, and would
fetch ``![x](https://…)`` images or show ``[Owner login](https://…)`` links of another visitor's making).
A multi-line text shown verbatim (a run's error) goes in :func:`md_code_block`.
"""

from __future__ import annotations

import re
import string
from typing import Any

_HTML = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
# CommonMark lets a backslash escape any ASCII punctuation; escaping all of it also breaks GFM's bare-URL
# autolinks ("https\:\/\/…", "a\@b\.c") and the table, strikethrough and emphasis syntax.
_ESCAPED = set(string.punctuation) - set(_HTML)


def md_text(value: Any, limit: int = 300) -> str:
    """``value`` as one line of Markdown that renders as its literal text (at most ``limit`` characters of
    it, then "…"): HTML's ``< > &`` as entities, other ASCII punctuation backslash-escaped, line breaks and
    tabs as spaces."""
    text = " ".join(str(value).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return "".join(_HTML.get(c) or ("\\" + c if c in _ESCAPED else c) for c in text)


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

"""User text inside the app's Markdown: shown as the characters typed, never as markup.

A run name (shown to every visitor) goes through :func:`md_text` before it is put in a ``gr.Markdown``
(which renders Markdown and HTML, and would fetch ``![x](https://…)`` images or show ``[Owner login](https://…)``
links of another visitor's making); a handler's one-line message, which may quote a refused value, through
:func:`md_message`; a multi-line text shown verbatim (a run's error) goes in :func:`md_code_block`. Each
leaves text without markup as it is, so the API (which returns the Markdown) reads the same words.
:func:`md_text` and :func:`md_code_block` are :mod:`jagg_engine.markup`'s (an export's model card uses them too).
"""

from __future__ import annotations

import re
from typing import Any

from jagg_engine.markup import md_code_block, md_text
from jagg_engine.markup import unlink as _unlink

__all__ = ["cannot_write", "md_code_block", "md_message", "md_text"]


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


def cannot_write(folder: Any, exc: OSError) -> str:
    """The one-line Markdown message of a folder that could not be written (read-only, full, …)."""
    return f"**Error:** cannot write {md_text(folder)}: {md_message(exc.strerror or exc)}"

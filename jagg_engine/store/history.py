"""A run folder's own files: ``history.jsonl`` (its append-only log, one checksummed record a line) and
``run.json`` (its row, rewritten atomically).

Each history line is a JSON record with the run's ``uid`` and, as its last key, ``"crc"``: 16 hex digits of
the sha256 of the line before it (:func:`history_line`), so a flipped byte fails the check. An append first
ends a torn last line (a process killed mid-write), so every record starts a line (:func:`append_line`).
:func:`read_history` takes the records that prove themselves and lists the lines it skipped, with why.
No database here: :mod:`.index` keeps the rows, :mod:`.reindex` rebuilds them from these files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import HISTORY_FILE, RUN_FILE

HISTORY_CRC = re.compile(r',"crc":"([0-9a-f]{16})"\}$')


def _crc(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def history_line(record: Mapping[str, Any]) -> str:
    """One line of ``history.jsonl``: the record as compact JSON, its last key ``crc`` the first 16 hex digits
    of the sha256 of the line before it (with the closing brace), so a flipped byte fails the check."""
    body = json.dumps(dict(record), separators=(",", ":"))
    return f'{body[:-1]},"crc":"{_crc(body)}"}}\n'


def history_end(folder: Path) -> tuple[Path, int]:
    """``folder/history.jsonl`` and its size now: truncating the file to that size undoes an append (a
    transaction whose commit failed, or a write cut short by a full disk)."""
    path = folder / HISTORY_FILE
    return path, path.stat().st_size if path.exists() else 0


def append_line(path: Path, size: int, line: str) -> None:
    """Append ``line`` to the history file ``path`` of ``size`` bytes (:func:`history_end`); a torn last
    line (a process killed mid-write) is ended first, so the record starts a line."""
    if size:
        with open(path, "rb") as fh:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                line = "\n" + line
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def write_run_file(folder: Path, doc: Mapping[str, Any]) -> None:
    """Write ``folder/run.json`` through a temporary file of this writer and a rename: a reader sees the old
    file or the new one, never a part."""
    tmp = folder / f".{RUN_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_text(json.dumps(dict(doc), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, folder / RUN_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass
class History:
    """The records of a ``history.jsonl`` that prove themselves, the lines skipped [(line number, why)], and
    how many lines were taken without a checksum (an older version wrote none)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    unverified: int = 0


def read_history(path: Path, uid: str | None) -> History:
    """Parse ``history.jsonl``, skipping: a torn last line; a line that is not a JSON record; a line whose
    checksum fails (a flipped byte); a line of another run (its uid is not ``uid``; None: any uid, for a run
    whose ``run.json`` is lost); a line without a checksum after one with (pasted: an older version
    writes none, and a version that writes them never goes back); and a line with a run uid but no intact
    checksum (this version writes both: a flipped byte inside ``"crc"``)."""
    out = History()
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return out
    lines = text.split("\n")
    checked = False
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        torn = number == len(lines)  # no end of line: the write of this line never finished
        match = HISTORY_CRC.search(raw)
        if match and _crc(raw[: match.start()] + "}") != match.group(1):
            out.skipped.append((number, "torn" if torn else "checksum does not match"))
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            out.skipped.append((number, "torn" if torn else "not a JSON record"))
            continue
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            out.skipped.append((number, "not a history record"))
            continue
        if match is None:
            if checked:
                out.skipped.append((number, "no checksum (pasted?)"))
                continue
            if record.get("uid") is not None:  # this version's line (it has a uid) with its checksum damaged
                out.skipped.append((number, "checksum missing or damaged"))
                continue
            out.unverified += 1
        checked = checked or match is not None
        if uid is not None and record.get("uid") not in (None, uid):
            out.skipped.append((number, f"of another run ({str(record.get('uid'))[:12]})"))
            continue
        if match is not None and not record.get("uid"):
            out.skipped.append((number, "no run uid"))
            continue
        record.pop("crc", None)
        out.records.append(record)
    return out


def rewrite_uid(folder: Path, old: str, new: str) -> None:
    """Give every checksummed line of ``folder/history.jsonl`` whose uid is ``old`` the uid ``new`` (each
    line re-checksummed; every other line kept byte for byte), through a temporary file and a rename."""
    path = folder / HISTORY_FILE
    try:
        lines = path.read_text(encoding="utf-8", errors="surrogateescape").split("\n")
    except FileNotFoundError:
        return
    out = []
    for raw in lines:
        match = HISTORY_CRC.search(raw)
        if match and _crc(raw[: match.start()] + "}") == match.group(1):
            record = json.loads(raw)
            if isinstance(record, dict) and record.get("uid") == old:
                record.pop("crc")
                raw = history_line({**record, "uid": new})[:-1]
        out.append(raw)
    tmp = folder / f".{HISTORY_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_text("\n".join(out), encoding="utf-8", errors="surrogateescape")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

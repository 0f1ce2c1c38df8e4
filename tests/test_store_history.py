"""The run folder's files (jagg_engine/store/history.py): history lines and their checksums, the torn-tail
repair of an append and its undo, run.json written whole or not at all, and a uid rewritten line by line."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from jagg_engine.store.base import HISTORY_FILE, RUN_FILE
from jagg_engine.store.history import (
    append_line,
    history_end,
    history_line,
    read_history,
    rewrite_uid,
    write_run_file,
)

UID, OTHER = "a" * 32, "b" * 32


def record(step: int, uid: str = UID) -> dict:
    return {"kind": "metrics", "step": step, "values": {"reward/mean": 0.5 + step}, "uid": uid}


def append(folder: Path, rec: dict) -> None:
    append_line(*history_end(folder), history_line(rec))


def test_a_line_carries_the_sha256_of_its_own_text_and_reads_back():
    line = history_line(record(1))
    body, crc = line[: line.index(',"crc":')] + "}", json.loads(line)["crc"]
    assert line.endswith('"}\n') and crc == hashlib.sha256(body.encode()).hexdigest()[:16]
    assert json.loads(body) == record(1)


def test_a_flipped_byte_fails_the_check_and_a_foreign_line_is_named(tmp_path):
    for step in (1, 2):
        append(tmp_path, record(step))
    append(tmp_path, record(3, OTHER))
    path = tmp_path / HISTORY_FILE
    lines = path.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace('"reward/mean":1.5', '"reward/mean":1.7')
    path.write_text("".join(lines))
    got = read_history(path, UID)
    assert [r["step"] for r in got.records] == [2]
    assert got.skipped == [(1, "checksum does not match"), (3, f"of another run ({OTHER[:12]})")]
    assert [r["step"] for r in read_history(path, None).records] == [2, 3]


def test_an_append_after_a_torn_tail_starts_its_own_line_and_truncation_undoes_it(tmp_path):
    append(tmp_path, record(1))
    path = tmp_path / HISTORY_FILE
    torn = history_line(record(2))[:25]
    with open(path, "a") as fh:
        fh.write(torn)  # a writer killed mid-line
    before = path.read_bytes()
    end = history_end(tmp_path)
    assert end == (path, len(before))
    append_line(*end, history_line(record(3)))
    got = read_history(path, UID)
    assert [r["step"] for r in got.records] == [1, 3]
    assert got.skipped == [(2, "not a JSON record")]
    os.truncate(*end)
    assert path.read_bytes() == before


def test_run_json_is_replaced_whole_or_left_as_it_was(tmp_path):
    write_run_file(tmp_path, {"id": 1, "uid": UID})
    assert json.loads((tmp_path / RUN_FILE).read_text()) == {"id": 1, "uid": UID}
    with pytest.raises(TypeError):
        write_run_file(tmp_path, {"id": 2, "uid": object()})  # fails while the new text is made
    assert json.loads((tmp_path / RUN_FILE).read_text()) == {"id": 1, "uid": UID}
    assert sorted(p.name for p in tmp_path.iterdir()) == [RUN_FILE]


def test_a_uid_rewrite_changes_only_that_uids_lines_each_with_a_new_checksum(tmp_path):
    append(tmp_path, record(1))
    append(tmp_path, record(2, OTHER))
    path = tmp_path / HISTORY_FILE
    with open(path, "a") as fh:
        fh.write("garbage\n")
    append(tmp_path, record(3))
    before = path.read_text().splitlines()
    new = "c" * 32
    rewrite_uid(tmp_path, UID, new)
    after = path.read_text().splitlines()
    assert after[1:3] == before[1:3]  # the other run's line and the garbage, byte for byte
    got = read_history(path, new)
    assert [r["step"] for r in got.records] == [1, 3]
    assert [n for n, _ in got.skipped] == [2, 3]
    assert [r["uid"] for r in got.records] == [new, new]

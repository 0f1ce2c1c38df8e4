"""The SQLite index alone (jagg_engine/store/index.py): its schema, rows and compare-and-sets, the latest
values, a corrupt file, a file replaced under an open index, and a read-only open."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from jagg_engine.store.base import DB_NAME, CorruptIndexError, StoreError
from jagg_engine.store.index import Index


def new_run(index: Index, run_id: int | None = None) -> int:
    with index.writing():
        row = {"name": "r", "config": json.dumps({}), "created_at": 1.0}
        return index.insert_run({**row, "id": run_id} if run_id else row)


@pytest.fixture
def index(tmp_path):
    index = Index(tmp_path / DB_NAME)
    yield index
    index.close()


def test_a_new_run_is_queued_with_its_own_uid_and_ids_go_above_every_folder(index):
    one, two = new_run(index), new_run(index)
    assert (one, two) == (1, 2)
    assert index.status(one) == "queued"
    assert len({index.uid(one), index.uid(two)}) == 2 and len(index.uid(one)) == 32
    assert index.next_id(highest_folder=0) == 3 and index.next_id(highest_folder=9) == 10
    with pytest.raises(StoreError, match="^no run with id 7$"):
        index.status(7)


def test_a_claim_takes_a_run_only_from_the_statuses_it_expects(index):
    run = new_run(index)
    with index.writing():
        assert index.claim_launch(run, pid=11, now=2.0)
        assert not index.claim_launch(run, pid=12, now=2.0)  # another launcher got it
        assert index.claim(run, ("queued",), pid=13, now=3.0)
        assert not index.claim(run, ("queued",), pid=14, now=3.0)
        assert not index.replace_pid(run, old=99, new=15, now=4.0)
    assert (index.status(run), index.row(run)["pid"]) == ("running", 13)


def test_metrics_keep_the_latest_values_through_a_truncation(index):
    run = new_run(index)
    with index.writing():
        for step in (1, 2, 3):
            index.insert_metrics(run, step, [(run, step, "reward/mean", float(step))])
    assert index.last_values(run, ["reward/mean"]) == {"reward/mean": (3, 3.0)}
    assert index.final_rewards() == {run: ("reward/mean", 3.0)}
    with index.writing():
        index.truncate_after(run, 1)
    assert index.last_values(run, ["reward/mean"]) == {"reward/mean": (1, 1.0)}
    assert index.row(run)["last_step"] == 1
    assert index.metrics_frame(run)["reward/mean"].tolist() == [1.0]


def test_a_corrupt_file_is_one_line_naming_reindex(tmp_path):
    path = tmp_path / DB_NAME
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    with pytest.raises(CorruptIndexError) as info:
        Index(path)
    assert "\n" not in str(info.value) and f"jagg reindex --runs-dir {tmp_path}" in str(info.value)


def test_a_file_replaced_under_an_open_index_is_reopened(tmp_path):
    index = Index(tmp_path / DB_NAME)
    try:
        new_run(index)
        other = Index(tmp_path / "other.db")
        new_run(other, run_id=5)
        other.close()
        for suffix in ("-wal", "-shm"):  # as `jagg reindex` swaps a file in: the old one's WAL goes with it
            os.replace(f"{tmp_path / DB_NAME}{suffix}", f"{tmp_path / 'old.db'}{suffix}")
        os.replace(tmp_path / "other.db", tmp_path / DB_NAME)
        assert [r["id"] for r in index.rows()] == [5]
        new_run(index)
        assert [r["id"] for r in index.rows()] == [6, 5]
    finally:
        index.close()


def test_a_read_only_open_reads_and_cannot_write(tmp_path):
    writer = Index(tmp_path / DB_NAME)
    run = new_run(writer)
    writer.close()
    reader = Index(tmp_path / DB_NAME, read_only=True)
    try:
        assert reader.read_only and reader.status(run) == "queued"
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            new_run(reader)
    finally:
        reader.close()

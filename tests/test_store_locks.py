"""Who may write (jagg_engine/store/locks.py): a run folder's lock held by another process (and dropped by
the kernel when that process is killed), the index lock a reindex holds, and whether a pid still lives."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from polling import wait_for

from jagg_engine.store import locks
from jagg_engine.store.base import DB_NAME, INDEX_LOCK, ClaimError, StoreError
from jagg_engine.store.locks import RunLock, index_exclusive, index_shared, pid_alive

HOLD = """
import sys, time
from jagg_engine.store.locks import RunLock
RunLock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def test_a_folder_held_by_another_process_is_refused_naming_it_until_that_process_is_killed(tmp_path):
    folder = tmp_path / "run-0001"
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert RunLock.held_elsewhere(folder)
        with pytest.raises(ClaimError) as info:
            RunLock.acquire(folder)
        assert (
            str(info.value)
            == f"run: another trainer holds {folder.resolve()} (pid {holder.pid}); not started"
        )
        with pytest.raises(StoreError, match=f"^busy \\(pid {holder.pid}\\)$"):
            with RunLock.exclusive(folder, "busy{holder}"):
                pass
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock.acquire(folder)  # the kernel dropped the killed holder's lock
    try:
        assert not RunLock.held_elsewhere(folder)
        assert RunLock.acquire(folder) is lock  # re-entrant in one process
        lock.release()
    finally:
        lock.release()


def test_a_write_waits_for_the_reindex_lock_and_gives_up_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "REINDEX_WAIT_S", 0.2)
    fd = os.open(tmp_path / INDEX_LOCK, os.O_RDWR | os.O_CREAT)
    try:
        with index_exclusive(tmp_path):
            with pytest.raises(StoreError) as info:
                index_shared(fd, tmp_path / DB_NAME)
        assert str(info.value).startswith(f"{tmp_path / DB_NAME}: `jagg reindex` has been rebuilding")
        index_shared(fd, tmp_path / DB_NAME)  # free again
    finally:
        os.close(fd)


def test_a_pid_lives_until_its_process_is_reaped_and_a_reused_one_is_not_the_recorded_one():
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_for(lambda: not pid_alive(child.pid), timeout=60)  # exited, not reaped: a zombie
    child.wait()
    assert not pid_alive(child.pid) and not pid_alive(0) and not pid_alive(-1)
    assert not pid_alive(os.getpid(), recorded_at=time.time() - 10 * 365 * 86400)  # started after the record

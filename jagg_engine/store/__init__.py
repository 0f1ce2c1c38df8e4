"""The run store: the history of runs, per-step metrics, gradient-fidelity probes and sample images.

One index per runs root (``<runs_dir>/jagg.db``) over one folder per run (``run-NNNN/``). The parts, each
its own module, by what it keeps:

- :mod:`.base` — file names, statuses and their transitions, errors, uids, the root's ``run-NNNN`` folders;
- :mod:`.index` — the SQLite index (``jagg.db``): schema, integrity, read-only fallback, every statement
  (also the groups a ``picks`` run asks about and the votes cast on them);
- :mod:`.history` — the run folder's files: ``history.jsonl`` (checksummed lines, torn-tail repair) and
  ``run.json``;
- :mod:`.locks` — the one-trainer lock of a run folder, the index lock of a root, process liveness;
- :mod:`.sqlite` — connections that wait on a busy database, and ``sqlite_utils`` imported without pandas;
- :mod:`.reindex` — ``jagg reindex``: the index rebuilt from the folders;
- :mod:`.run_store` — :class:`RunStore`, the façade every caller uses, and :func:`open_store`.

Only the main process of a run writes (rank 0 under accelerate). The store does not know about ranks: the
trainer must simply not call it on the other ranks.

Metric keys are namespaced with "/" (cleanrl style):
    reward/mean, reward/std, reward/<name>/mean   training rollouts (weighted total, then each component)
    eval/reward/mean, eval/reward/<name>/mean     deterministic eval
    loss/policy, loss/approx_kl, loss/clipfrac, loss/kl
    grad/norm, lr
    time/sampling, time/reward, time/update_forward, time/update_backward, time/update, time/step (seconds)
    time/train_elapsed, time/unix, time/eval       training wall seconds from step 1 to the end of this step's
                                                   update, evals left out; the Unix time of that instant; an
                                                   eval's own seconds (steps with an eval)
    count/forward, count/backward                  transformer passes in the update phase
    memory/rss_bytes, memory/peak_cuda_bytes       the main process: resident set size; peak CUDA memory of the step
    picks/asked, picks/voted, picks/votes,          a picks run (jagg_engine.rewards.picks): groups asked and voted
    picks/wanted, picks/agreement(_all),            this step, votes of the run and wanted, held-back agreement of the
    picks/timed_out, picks/wait_s                   preference model, groups closed without a vote, seconds waited
:data:`FINAL_REWARD_KEYS` is the order in which a run's "final reward" is looked up.

Status transitions (anything else raises :class:`StoreError`)::

    queued  → running | failed | cancelled
    running → finished | failed | cancelled
    failed, cancelled → running | queued      (resume)
    failed, cancelled → failed                (a resume that fails before it runs: the new error replaces
                                               the old one)
    finished → (nothing)

Launchers: ``runs.launcher`` says who will start a queued run: ``app`` (the app's queue starts it) or ``cli``
(``jagg train`` created it and starts it itself; the app never does). Rows written before the column existed
count as the app's when they are still queued without a process.

Pair modes: ``runs.pair_mode`` says how the app schedules the two runs of a compare pair (NULL: not a pair):
``side-by-side`` (both start together and share the CPU, its threads split between them) or ``sequential``
(one after the other).

The run folder stands on its own; ``jagg.db`` is an index of the folders. Each run folder holds
``run.json`` (the run's row: a unique ``uid`` beyond the integer id, its config, status, times, pid), rewritten
atomically in the same transaction as every change of that row, and ``history.jsonl``, an append-only log of
its metrics, probes, samples and truncations, appended in the same transaction as the rows (before the commit:
a failed append rolls the rows back). :func:`reindex` (``jagg reindex``) rebuilds a lost or corrupt ``jagg.db``
from the folders. A new run never takes an existing folder: its id is above every ``run-NNNN`` folder of the
root and its folder is made with an exclusive ``mkdir`` (:meth:`RunStore.create_run_folder`). The WAL is
checkpointed after every logged step, so deleting the ``-wal`` file can lose at most the step in flight.

One trainer per run: :meth:`RunStore.claim` moves a run to running only from the statuses its trainer expects
(a compare-and-set in one transaction), :meth:`RunStore.claim_launch` gives a queued run to one launcher,
and :class:`RunLock` (``fcntl.flock`` on the run folder) is held by the trainer for its whole life.

Read-only: on a folder it cannot write (a read-only mount, a full disk where the WAL files cannot be made),
:func:`open_store` opens the database read-only (``mode=ro``, else ``immutable=1``); reads work and every
write raises :class:`StoreError` in one line.
"""

from .base import (
    ACTIVE_STATUSES,
    BUSY_TIMEOUT_S,
    DB_NAME,
    FINAL_REWARD_KEYS,
    HISTORY_FILE,
    INDEX_LOCK,
    LAUNCHERS,
    LOG_NAME,
    LOG_TAIL_LINES,
    PAIR_MODES,
    REINDEX_HINT,
    REINDEX_WAIT_S,
    RUN_FILE,
    RUN_FILE_FORMAT,
    RUN_FOLDER,
    SAMPLE_KINDS,
    STATUSES,
    TRANSITIONS,
    ClaimError,
    CorruptIndexError,
    StoreError,
    file_tail,
    highest_folder_id,
    missing_index_message,
    new_uid,
    run_folders_with_files,
)
from .history import History, history_line, read_history
from .index import WAL_SIZE_LIMIT, Index
from .locks import PID_START_SLACK_S, RunLock, pid_alive
from .reindex import ReindexReport, read_run_folder, reindex
from .run_store import RunStore, open_store

__all__ = [
    "ACTIVE_STATUSES",
    "BUSY_TIMEOUT_S",
    "DB_NAME",
    "FINAL_REWARD_KEYS",
    "HISTORY_FILE",
    "INDEX_LOCK",
    "LAUNCHERS",
    "LOG_NAME",
    "LOG_TAIL_LINES",
    "PAIR_MODES",
    "PID_START_SLACK_S",
    "REINDEX_HINT",
    "REINDEX_WAIT_S",
    "RUN_FILE",
    "RUN_FILE_FORMAT",
    "RUN_FOLDER",
    "SAMPLE_KINDS",
    "STATUSES",
    "TRANSITIONS",
    "WAL_SIZE_LIMIT",
    "ClaimError",
    "CorruptIndexError",
    "History",
    "Index",
    "ReindexReport",
    "RunLock",
    "RunStore",
    "StoreError",
    "file_tail",
    "highest_folder_id",
    "history_line",
    "missing_index_message",
    "new_uid",
    "open_store",
    "pid_alive",
    "read_history",
    "read_run_folder",
    "reindex",
    "run_folders_with_files",
]

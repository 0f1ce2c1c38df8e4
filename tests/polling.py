"""Polling for the tests that wait on a trainer or an app: one helper instead of a loop per file."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def wait_for(predicate: Callable[[], object], timeout: float = 300.0, every: float = 0.1) -> bool:
    """True as soon as ``predicate()`` is truthy (checked every ``every`` seconds), False after ``timeout``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn(cmd: Sequence[str], log: Path, **kwargs) -> subprocess.Popen:
    """Start ``cmd`` with its stdout and stderr into the file ``log``, not into pipes: a pipe that nobody reads
    until the process ends fills (64 KiB, a few hundred lines of a progress bar) and blocks the process in its
    next write, which on a slow machine a test that polls for minutes runs into.

    The process starts with SIGINT at its default, as a command typed at a terminal does: a suite started in
    the background of a non-interactive shell (``make test &``) inherits SIGINT ignored, and so would every
    process it starts, so that a test's Ctrl-C reached nobody."""
    with open(log, "w") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, text=True, preexec_fn=_default_sigint, **kwargs
        )


def tail(log: Path, chars: int = 3000) -> str:
    """The last ``chars`` characters of a :func:`spawn` log (for an assertion's message)."""
    return log.read_text(errors="replace")[-chars:] if log.is_file() else f"(no {log})"

"""Polling for the tests that wait on a trainer or an app: one helper instead of a loop per file."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float = 300.0, every: float = 0.1) -> bool:
    """True as soon as ``predicate()`` is truthy (checked every ``every`` seconds), False after ``timeout``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False

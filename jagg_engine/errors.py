"""Errors shared across the command line: one class so that `python -m jagg_engine.cli` and the installed
`jagg` entry point catch the same type."""


class UsageError(Exception):
    """A user error; the CLI prints it as one line ``jagg <command>: error: <message>`` and exits with code 2."""


class DiskFullError(OSError):
    """A write failed for lack of space (ENOSPC, EDQUOT, or SQLite's "database or disk is full").

    The message is the one line a failed run stores: ``disk full: <path>``."""

    def __init__(self, path: object):
        super().__init__(f"disk full: {path}")
        self.path = str(path)


# How a library written in Rust (safetensors' SafetensorError) words ENOSPC: not an OSError, only its text.
_RUST_ENOSPC = ("No space left on device (os error 28)", "Disk quota exceeded (os error 122)")


def disk_full_path(exc: BaseException, default: object) -> str:
    """The file a full-disk error names (its ``filename``, a :class:`DiskFullError`'s path), else ``default``."""
    if isinstance(exc, DiskFullError):
        return exc.path
    return str(getattr(exc, "filename", None) or default)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a full disk or an exceeded quota."""
    import errno
    import sqlite3

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError):
            return True
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, sqlite3.Error) and (
            getattr(exc, "sqlite_errorcode", None) == 13 or "disk is full" in str(exc)  # SQLITE_FULL
        ):
            return True
        if not isinstance(exc, OSError) and any(s in str(exc) for s in _RUST_ENOSPC):  # safetensors' writer
            return True
        exc = exc.__cause__ or exc.__context__
    return False

"""Errors shared across the command line: one class so that `python -m jagg_engine.cli` and the installed
`jagg` entry point catch the same type."""


class UsageError(Exception):
    """A user error; the CLI prints it as one line ``jagg <command>: error: <message>`` and exits with code 2."""

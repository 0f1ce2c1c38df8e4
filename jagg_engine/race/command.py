"""`jagg race`'s command line: its options, in any order among the ``key=value`` overrides."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from jagg_engine.errors import UsageError
from jagg_engine.store import DB_NAME

from .folder import _read_plan, driver_gone
from .heats import race
from .plan import HISTORY_DIR, RACE_JSON, RACE_MD, RACE_SVG, RaceError, parse_seeds, parse_variant
from .report import report
from .summary import markdown_table

# ------------------------------------------------------------------------------------------------ CLI


def _threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="NAME:key=value,...",
        help="a contestant: a name and its overrides (commas inside [...] or {...} do not split; \\, is a"
        " literal comma). Give two or more; the first is the baseline.",
    )
    p.add_argument(
        "--seeds", default="0,1,2", help="comma-separated seeds; one heat per seed (default 0,1,2)"
    )
    p.add_argument(
        "--out", required=False, default=None, help="folder of the race: runs/, race.json, .svg, .md"
    )
    p.add_argument(
        "--threads",
        type=_threads,
        default=None,
        help="torch CPU threads of each run, side by side whatever the machine (default: the app's rule for"
        " a compare pair: the cores split evenly between the variants, or one after the other on a GPU or"
        " with too few cores)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild race.json/.svg/.md of --out DIR from its runs (runs/jagg.db, or history/ without it)",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="NAME",
        help="with --report-only: measure against this variant instead of the first (race-vs-NAME.json/.svg/.md)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config (see configs/); omitted = the tiny-shapes defaults")
    p.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        help="key=value overrides of every variant, as `jagg train` takes them (before or after the options)",
    )
    _add_options(p)


class _OptionsParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(message)


def _parse_rest(args: argparse.Namespace) -> None:
    """Options given after the first positional land in ``overrides`` (argparse.REMAINDER): parse them out,
    keeping the ones given before, so options and key=value items may come in any order."""
    p = _OptionsParser(prog="jagg race", add_help=False)
    _add_options(p)
    _, rest = p.parse_known_args(args.overrides, namespace=args)
    if args.config and "=" in args.config and not Path(args.config).is_file():  # `jagg race steps=3 ...`
        rest, args.config = [args.config, *rest], None
    for item in rest:
        if item.startswith("-"):
            raise UsageError(f"unrecognized option {item!r}")
    args.overrides = rest


def run(args: argparse.Namespace) -> int:
    _parse_rest(args)
    if not args.out:
        raise UsageError("--out: required (the race's folder)")
    out = Path(args.out)
    try:
        if args.report_only:
            runs = (out / "runs" / DB_NAME).is_file() or (out / HISTORY_DIR).is_dir()
            if not (out / RACE_JSON).is_file() or not runs:
                raise UsageError(
                    f"--out: {out} holds no race ({RACE_JSON} and runs/{DB_NAME} or {HISTORY_DIR}/)"
                )
            gone = driver_gone(out)  # a race whose driver is gone reads interrupted from now on
            plan = _read_plan(out)
            if gone and plan.get("status") == "running":  # race.json could not be updated (read-only)
                print(f"jagg race: {gone}", file=sys.stderr)
                plan["status"] = "interrupted"
            summary, files = report(out, plan, baseline=args.baseline)
            if summary.get("partial"):
                print(f"jagg race: {summary['partial']}", file=sys.stderr)
        else:
            if args.baseline is not None:
                raise UsageError(
                    "--baseline: only with --report-only; a race's baseline is its first --variant"
                )
            variants = [parse_variant(text) for text in args.variant or []]
            seeds = parse_seeds(args.seeds)
            command = shlex.join(["jagg", "race", *sys.argv[2:]]) if sys.argv[1:2] == ["race"] else ""
            summary = race(args.config, args.overrides, variants, seeds, out, args.threads, command)
            files = [out / RACE_JSON, out / RACE_SVG, out / RACE_MD]
    except RaceError as exc:
        print(f"jagg race: error: {exc}", file=sys.stderr)
        return 1
    print(markdown_table(summary))
    written = (
        ", ".join(map(str, files)) or "nothing written while the race runs (its driver writes the files)"
    )
    print(f"jagg race: {written}", file=sys.stderr)
    return 0

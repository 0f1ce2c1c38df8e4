"""Regenerate the results written from reports/ into the docs: every block between
``<!-- results: KIND ARGS -->`` and ``<!-- end results -->`` in README.md, docs/*.md and reports/README.md.

    python scripts/results.py           # rewrite the blocks (`make results`; after adding a race, rerun it)
    python scripts/results.py --check   # change nothing; exit 1 naming each block that is not up to date

Kinds:
    race NAME                 the race's table (time to the baseline's final eval, final evals, steps, training
                              time a step) and its seed-mean eval curves, from reports/race/NAME/race.json, and
                              a table per race-vs-BASELINE.json beside it
    seeds NAME [EVERY]        each run's eval every EVERY (10) steps, a row a variant and seed, from the race's
                              committed history/
    headline NAME VARIANT     one sentence: how soon VARIANT of race NAME reached its baseline's final eval
    index                     reports/README.md's table of every report: date, command, figure, claim, whether
                              the committed files rebuild it (claims and the other reports' commands from
                              reports/index.yaml)

Nothing here is typed: each figure is read from the committed race.json, which `jagg race` (or
`jagg race --report-only`) wrote.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
BLOCK = re.compile(r"(<!-- results: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- end results -->)", re.S)
FILES = ("README.md", "docs/*.md", "reports/README.md")


def _secs(t: float | None) -> str:
    if t is None:
        return "—"
    return f"{t:.{2 if t < 10 else 1 if t < 100 else 0}f} s"


def _race(name: str) -> dict[str, Any]:
    return json.loads((REPORTS / "race" / name / "race.json").read_text(encoding="utf-8"))


def _final(v: dict[str, Any]) -> str:
    fe = v["final_eval"]
    return "—" if fe["mean"] is None else f"{fe['mean']:.4f} [{fe['min']:.4f} – {fe['max']:.4f}]"


def race_table(summary: dict[str, Any], link: str) -> list[str]:
    """The race's table: one row a variant, in the race's order."""
    base, level = summary["baseline"], summary["level"]
    variants = summary["variants"]
    base_row = next(v for v in variants if v["variant"] == base)
    per_step = {
        v["variant"]: (v["training_time_s"]["mean"] / v["final_step"])
        if v["training_time_s"]["mean"] and v["final_step"]
        else None
        for v in variants
    }
    lines = [
        f"Time to {base}'s final seed-mean eval, {level:.4f} (step {summary['level_step']}; {link}), in training"
        " time with evals left out:",
        "",
        f"| variant | time to {level:.4f} | × {base}'s time | per seed: min–max (reached) | final eval: mean"
        " [min–max] | steps | training time a step (× baseline's) |",
        "|---|---|---|---|---|---|---|",
    ]
    if summary.get("partial"):
        lines[0:0] = [f"**Partial:** {summary['partial']}.", ""]
    if not summary.get("baseline_improved", True):
        lines.insert(
            1,
            f"\n{base}'s final eval is not above its step-0 eval ({summary['baseline_start']:.4f}): the times"
            " say nothing.",
        )
    for v in variants:
        per = v["time_to_level_per_seed_s"]
        span = "—" if per["min"] is None else f"{_secs(per['min'])} – {_secs(per['max'])}"
        ratio = "—" if v["ratio_to_baseline_time"] is None else f"{v['ratio_to_baseline_time']:.2f}×"
        reach = "not reached" if v["time_to_level_s"] is None else _secs(v["time_to_level_s"])
        step = per_step[v["variant"]]
        step_text = "—" if step is None else _secs(step)
        if step is not None and per_step[base] and v["variant"] != base:
            step_text += f" ({step / per_step[base]:.2f}×)"
        name = f"{v['variant']} (baseline)" if v["variant"] == base else v["variant"]
        lines.append(
            f"| {name} | {reach} | {ratio} | {span} ({per['reached']}/{per['seeds']}) | {_final(v)} |"
            f" {v['final_step']} | {step_text} |"
        )
    del base_row
    return lines


def eval_curves(summary: dict[str, Any]) -> list[str]:
    """The seed-mean eval of each variant at its eval steps."""
    parts = []
    steps = None
    for v in summary["variants"]:
        curve = v["curve"]
        steps = steps if steps and len(steps) >= len(curve["step"]) else curve["step"]
        parts.append(f"{v['variant']} " + " ".join(f"{y:.3f}" for y in curve["eval"]))
    if not steps:
        return []
    shown = ", ".join(str(s) for s in steps[:3]) + (f", …, {steps[-1]}" if len(steps) > 3 else "")
    return [f"Seed-mean eval at steps {shown}: " + "; ".join(parts) + "."]


def block_race(name: str) -> list[str]:
    race = _race(name)
    folder = f"reports/race/{name}"
    out = race_table(race["summary"], f"`{folder}/race.json`")
    out += ["", *eval_curves(race["summary"])]
    for other in sorted((REPORTS / "race" / name).glob("race-vs-*.json")):
        summary = json.loads(other.read_text(encoding="utf-8"))["summary"]
        out += ["", *race_table(summary, f"`{folder}/{other.name}`")]
    return out


def seed_curves(name: str, every: str = "10") -> list[str]:
    """Each run's eval at every ``every``-th step, one row a variant and seed, from the race's committed
    history/ (a race written before history/ was kept has none: said so)."""
    race, step_every = _race(name), int(every)
    folder = REPORTS / "race" / name / "history"
    rows, steps = [], set()
    for run in race["runs"]:
        path = folder / f"run-{int(run['run_id']):04d}" / "history.jsonl.gz"
        if not path.is_file():
            return [f"(no per-seed curves: reports/race/{name}/history/ does not hold run {run['run_id']})"]
        evals = {}
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            for line in lines:
                row = json.loads(line)
                value = row.get("values", {}).get("eval/reward/mean") if row["kind"] == "metrics" else None
                if value is not None and row["step"] % step_every == 0:
                    evals[int(row["step"])] = value
        steps |= set(evals)
        rows.append((run["variant"], run["seed"], evals))
    shown = sorted(steps)
    out = [
        f"| variant | seed | eval at steps {', '.join(map(str, shown))} |",
        "|---|---|---|",
    ]
    order = [v["name"] for v in race["variants"]]
    for variant, seed, evals in sorted(rows, key=lambda r: (r[1], order.index(r[0]))):
        cells = " ".join("—" if s not in evals else f"{evals[s]:.3f}" for s in shown)
        out.append(f"| {variant} | {seed} | {cells} |")
    return out


def block_headline(name: str, variant: str) -> list[str]:
    s = _race(name)["summary"]
    v = next(x for x in s["variants"] if x["variant"] == variant)
    per = v["time_to_level_per_seed_s"]
    seeds = len(_race(name)["seeds"])
    return [
        f"**{variant} reached {s['baseline']}'s final seed-mean eval ({s['level']:.4f}) in"
        f" {_secs(v['time_to_level_s'])} of training, {v['ratio_to_baseline_time']:.2f}× {s['baseline']}'s time**"
        f" ({per['reached']}/{per['seeds']} seeds, each {_secs(per['min'])} – {_secs(per['max'])}); its final eval"
        f" {_final(v)} after {v['final_step']} steps ({seeds} seeds, `reports/race/{name}/race.json`)."
    ]


def _date(race: dict[str, Any]) -> str:
    started = (race.get("driver") or {}).get("started_at") or min(
        (r.get("trained_from_unix") or float("inf") for r in race.get("runs") or []), default=float("inf")
    )
    return "—" if started == float("inf") else time.strftime("%Y-%m-%d", time.gmtime(started))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def block_index() -> list[str]:
    meta = yaml.safe_load((REPORTS / "index.yaml").read_text(encoding="utf-8"))
    lines = [
        "| report | date | command | figure | claim | rebuilt from the repository |",
        "|---|---|---|---|---|---|",
    ]
    races = sorted(p.name for p in (REPORTS / "race").iterdir() if (p / "race.json").is_file())
    for name in races:
        race = _race(name)
        folder = f"race/{name}"
        rebuild = (
            f"yes: `jagg race --report-only --out reports/{folder}` reads `history/`"
            if (REPORTS / folder / "history").is_dir()
            else "no: its runs were not committed (race.json keeps each seed's eval curve)"
        )
        claim = (meta.get("races") or {}).get(name, "")
        lines.append(
            f"| [{folder}]({folder}/race.md) | {_date(race)} | `{_cell(race['command'])}` |"
            f" [race.svg]({folder}/race.svg) | {_cell(claim)} | {rebuild} |"
        )
    for entry in meta.get("other") or []:
        figure = f"[{Path(entry['figure']).name}]({entry['figure']})" if entry.get("figure") else "—"
        lines.append(
            f"| [{entry['path']}]({entry['path']}) | {entry['date']} | `{_cell(entry['command'])}` | {figure} |"
            f" {_cell(entry['claim'])} | {entry.get('rebuild', 'by its command (its inputs are committed)')} |"
        )
    for name in races:
        if name not in (meta.get("races") or {}):
            raise SystemExit(f"reports/index.yaml: races: {name}: no claim; say what the race supports")
    return lines


def render(args: str) -> str:
    kind, *rest = args.split()
    kinds = {"race": block_race, "seeds": seed_curves, "headline": block_headline, "index": block_index}
    lines = kinds[kind](*rest)
    return "\n".join(lines) + "\n"


def update(text: str) -> tuple[str, list[str]]:
    """``text`` with every block regenerated, and the blocks that changed."""
    changed = []

    def one(m: re.Match) -> str:
        body = render(m.group("args"))
        if body != m.group("body"):
            changed.append(m.group("args"))
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(one, text), changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is out of date")
    args = p.parse_args(argv)
    stale = []
    for pattern in FILES:
        for path in sorted(ROOT.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            new, changed = update(text)
            stale += [f"{path.relative_to(ROOT)}: {c}" for c in changed]
            if changed and not args.check:
                path.write_text(new, encoding="utf-8")
    for line in stale:
        print(f"{'out of date' if args.check else 'regenerated'}: {line}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

"""Train on a scripted person's picks: how far its hidden taste rises for a vote budget, on tiny-shapes.

    python scripts/bench_picks.py --out reports/picks            # the reduced default: 5 steps, 10 votes; ~15-20 min on 2 busy cores
    python scripts/bench_picks.py --budgets 100 300 --steps 75 --prompts-per-step 8 --group-size 8 --picks-per-step 4

Every run is `jagg train configs/tiny-shapes-cpu.yaml` (a subprocess, one after the other) with smaller steps
(``--steps``, ``--prompts-per-step``, ``--group-size``) and an eval of ``--eval-prompts`` prompts (seed 0) before
training and after the last step. The hidden taste (:data:`jagg_engine.picks.TASTES`, ``--taste``, default
"big": the share of foreground pixels) is scored on those eval images. The runs:

- ``none``: no training, the step-0 eval (the same initial model and eval noise for every run; checked);
- ``ceiling``: ``rewards={taste: 1.0}``, trained on the hidden score directly;
- ``control``: trained directly on another taste (red for big and small, big for red), scored with this one: how
  much of a rise any training of these steps gives (the model drifts whatever it is trained on);
- per budget B: ``model``: ``rewards={picks: 1.0}`` with ``picks_per_step`` = ``--picks-per-step`` groups a step
  chosen by the preference model's uncertainty, ``budget`` B, and ``votes-alone``: ``picks_per_step: all``
  (every group asked, the votes are the reward), ``budget`` B; after the budget is spent the model run goes on
  with the model's scores, the votes-alone run with zero rewards (no update).

A :class:`jagg_engine.picks.ScriptedPerson` votes "best" by the taste through the store's API, in a thread of this
process, while each picks run waits for it (``timeout_s`` 600). Per run: the taste's eval mean at start and
end, votes cast, the held-back agreement of the preference model (``picks/agreement_all``), the person's
seconds per vote (reading a group's PNGs, scoring, casting: the API's cost), the trainer's seconds waiting per
vote, and the run's wall seconds per vote. Writes ``<out>/bench.json`` and ``<out>/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jagg_engine.picks import TASTES, ScriptedPerson, load_images  # noqa: E402
from jagg_engine.store import open_store  # noqa: E402


def taste_by_step(store: Any, run_id: int, run_dir: str, taste: str) -> dict[int, float]:
    """The taste's mean over each eval step's images."""
    by_step: dict[int, list[str]] = {}
    for s in store.samples(run_id, kind="eval"):
        by_step.setdefault(s["step"], []).append(s["path"])
    return {
        step: float(TASTES[taste](load_images(run_dir, sorted(paths))).mean())
        for step, paths in sorted(by_step.items())
    }


def run_one(name: str, overrides: list[str], args: argparse.Namespace, person: bool) -> dict[str, Any]:
    runs_dir = Path(tempfile.mkdtemp(prefix=f"bench-picks-{name}-"))
    cmd = [sys.executable, "-m", "jagg_engine.cli", "train", "configs/tiny-shapes-cpu.yaml", *common(args)]
    cmd += [*overrides, f"name=picks-{name}", "--runs-dir", str(runs_dir)]
    print(f"[{name}] {' '.join(cmd[3:])}", flush=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    stop, thread, voter = threading.Event(), None, None
    if person:
        store = None
        while store is None and proc.poll() is None:
            time.sleep(0.5)
            if not (runs_dir / "jagg.db").exists():
                continue
            try:  # the trainer may be creating the index this very moment
                opened = open_store(runs_dir)
            except sqlite3.OperationalError:
                continue
            store = opened if opened.list_runs() else opened.close()
        if store is None:
            raise SystemExit(
                f"[{name}] jagg train ended before its run appeared: {proc.stderr.read()[-2000:]}"
            )
        voter = ScriptedPerson(store, store.list_runs()[0]["id"], taste=args.taste)
        thread = threading.Thread(target=voter.run, args=(stop, 0.1), daemon=True)
        thread.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - started
    stop.set()
    if thread is not None:
        thread.join(timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"[{name}] jagg train failed ({proc.returncode}): {err[-2000:]}")
    store = open_store(runs_dir)
    (run,) = store.list_runs()
    tastes = taste_by_step(store, run["id"], run["run_dir"], args.taste)
    frame = store.metrics_frame(run["id"]).set_index("step")
    votes = len(store.votes(run["id"]))
    out: dict[str, Any] = {
        "run": name,
        "overrides": overrides,
        "taste_by_eval_step": tastes,
        "taste_start": tastes[min(tastes)],
        "taste_end": tastes[max(tastes)],
        "wall_s": wall,
        "votes": votes,
    }
    if person:
        last = frame.index.max()
        out.update(
            agreement_all=None
            if frame.loc[last, "picks/agreement_all"] != frame.loc[last, "picks/agreement_all"]
            else float(frame.loc[last, "picks/agreement_all"]),
            agreement_by_step={int(s): float(v) for s, v in frame["picks/agreement"].dropna().items()},
            person_s_per_vote=voter.seconds / max(voter.cast, 1),
            wait_s_per_vote=float(frame["picks/wait_s"].sum()) / max(votes, 1),
            wall_s_per_vote=wall / max(votes, 1),
        )
    print(
        f"[{name}] taste {out['taste_start']:.4f} -> {out['taste_end']:.4f}, {votes} votes, {wall:.0f} s",
        flush=True,
    )
    return out


def common(args: argparse.Namespace) -> list[str]:
    return [
        f"steps={args.steps}",
        f"prompts_per_step={args.prompts_per_step}",
        f"group_size={args.group_size}",
        f"eval_num_prompts={args.eval_prompts}",
        "eval_seeds=[0]",
        f"eval_every={args.steps}",
        "sample_every=0",
        "checkpoint_every=0",
        f"seed={args.seed}",
    ]


def write_markdown(doc: dict[str, Any], path: Path) -> None:
    a = doc["args"]
    lines = [
        "# Train on a scripted person's picks (tiny-shapes)",
        "",
        f"Command: `{doc['command']}`  ",
        f"Machine: {doc['machine']}; {doc['date']}.",
        "",
        f"Taste **{a['taste']}** (hidden from the runs), scored on the {a['eval_prompts']} eval prompts (seed 0) before"
        f" training and after step {a['steps']}; {a['prompts_per_step']} prompts × {a['group_size']} samples a step;"
        f" the model runs ask {a['picks_per_step']} group(s) a step.",
        "",
        "| run | votes | taste start | taste end | change | agreement (held back) | person s/vote | wait s/vote | run wall s/vote |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["runs"]:
        agree = r.get("agreement_all")
        lines.append(
            f"| {r['run']} | {r['votes']} | {r['taste_start']:.4f} | {r['taste_end']:.4f} |"
            f" {r['taste_end'] - r['taste_start']:+.4f} | {'–' if agree is None else f'{agree:.3f}'} |"
            f" {r.get('person_s_per_vote', float('nan')):.3f} | {r.get('wait_s_per_vote', float('nan')):.2f} |"
            f" {r.get('wall_s_per_vote', float('nan')):.1f} |"
        )
    lines += ["", *doc["notes"], ""]
    path.write_text("\n".join(line.replace("nan", "–") for line in lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budgets", type=int, nargs="+", default=[10])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--picks-per-step", type=int, default=2)
    p.add_argument("--eval-prompts", type=int, default=20)
    p.add_argument("--taste", choices=sorted(TASTES), default="big")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-votes-alone", action="store_true")
    p.add_argument(
        "--skip-model", action="store_true", help="no preference-model run (e.g. votes-alone only)"
    )
    p.add_argument("--skip-control", action="store_true")
    p.add_argument("--skip-ceiling", action="store_true", help="no run trained on the taste directly")
    p.add_argument("--out", type=Path, default=REPO / "reports" / "picks")
    args = p.parse_args(argv)
    picks = "{{picks_per_step: {k}, budget: {b}, timeout_s: 600, poll_s: 0.1}}"
    other = "big" if args.taste == "red" else "red"
    plan: list[tuple[str, list[str], bool]] = []  # (name, overrides, a scripted person votes)
    if not args.skip_ceiling:
        plan.append(
            ("ceiling", ["rewards={taste: 1.0}", f"reward_options={{taste: {{taste: {args.taste}}}}}"], False)
        )
    if not args.skip_control:
        plan.append(
            (
                f"control-{other}",
                ["rewards={taste: 1.0}", f"reward_options={{taste: {{taste: {other}}}}}"],
                False,
            )
        )
    for b in args.budgets:
        for name, k, skipped in (
            ("model", args.picks_per_step, args.skip_model),
            ("votes-alone", "all", args.skip_votes_alone),
        ):
            if not skipped:
                options = "reward_options={picks: " + picks.format(k=k, b=b) + "}"
                plan.append((f"{name}-{b}", ["rewards={picks: 1.0}", options], True))
    runs = [run_one(name, overrides, args, person) for name, overrides, person in plan]
    if not runs:
        p.error("every run was skipped")
    starts = {round(r["taste_start"], 6) for r in runs}
    none = {
        "run": "none",
        "overrides": [],
        "taste_start": runs[0]["taste_start"],
        "taste_end": runs[0]["taste_start"],
        "votes": 0,
    }
    notes = [
        "`none` is the step-0 eval (no training); every run starts there"
        + (
            " (checked: one start value)."
            if len(starts) == 1
            else f" (NOT one start value: {sorted(starts)})."
        ),
        "person s/vote: the scripted person's time to read a group's PNGs, score them and cast its vote through the"
        " store; wait s/vote: the trainer's seconds waiting for votes, per vote (the person polls every 0.1 s);"
        " run wall s/vote: the run's whole wall time over its votes (training included).",
        "One seed, a short run: a difference of a few thousandths is within run-to-run noise.",
    ]
    if not args.skip_control:
        notes.append(
            f"control-{other}: trained on the taste {other!r}, scored with {args.taste!r}: the rise these steps"
            " give whatever the reward; a picks run's rise above it is what the votes bought."
        )
    doc = {
        "command": "python scripts/bench_picks.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared)"
        + (f", nice {os.nice(0)}" if os.nice(0) else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": [none, *runs],
        "notes": notes,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    write_markdown(doc, args.out / "README.md")
    print((args.out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How much noise an estimator adds to the batch gradient, read from races' histories (no model run).

    python scripts/grad_noise.py reports/race/tiny-shapes-pair-s11 reports/race/tiny-shapes-pair-s1-2 \\
        reports/race/tiny-shapes-mix-s2 --baseline f-exact

Each training step logs the norm of its gradient (``grad/norm``, before clipping). Where the exact gradient of a
batch is almost all batch noise (the bias study: ‖E g‖² under 1 % of a batch gradient's square on tiny-shapes),
E‖g‖² is its variance, and an estimator's mean ‖g‖² over a run, as a multiple of the exact backward's on the same
seed, is its variance as a multiple of exact's: an unbiased estimator at that ratio v trains like the exact
backward on about 1/v of the batch. For each variant of the races and each seed: the mean ‖g‖² over the run's
steps and its ratio to ``--baseline``'s on that seed (seeds without the baseline are compared with the baseline's
mean over the seeds it has), then the variant's mean ratio over seeds. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NAME = re.compile(r"^(?P<variant>.+)-seed(?P<seed>\d+)$")


def mean_square_norms(races: list[Path]) -> dict[str, dict[int, float]]:
    """variant → seed → the run's mean ‖g‖² over its training steps."""
    from jagg_engine.race.report import race_store

    out: dict[str, dict[int, float]] = defaultdict(dict)
    for race in races:
        with race_store(race) as (store, _):
            for run in store.list_runs():
                m = NAME.match(run["name"])
                if m is None:
                    continue
                frame = store.metrics_frame(run["id"])
                norms = frame.loc[frame["step"] > 0, "grad/norm"].dropna()
                if norms.empty:
                    continue
                out[m["variant"]][int(m["seed"])] = float((norms**2).mean())
    return out


def table(ms: dict[str, dict[int, float]], baseline: str) -> list[str]:
    if baseline not in ms:
        raise SystemExit(f"--baseline: no variant {baseline!r} in these races (have {', '.join(sorted(ms))})")
    base = ms[baseline]
    base_mean = statistics.mean(base.values())
    seeds = sorted({s for runs in ms.values() for s in runs})
    lines = [
        f"| variant | {' | '.join(f'seed {s}' for s in seeds)} | mean ‖g‖² ÷ {baseline}'s |",
        "|---|" + "---|" * (len(seeds) + 1),
    ]
    for variant, runs in ms.items():
        ratios = {s: v / base.get(s, base_mean) for s, v in runs.items()}
        cells = [f"{ratios[s]:.2f}" if s in ratios else "—" for s in seeds]
        lines.append(f"| {variant} | {' | '.join(cells)} | {statistics.mean(ratios.values()):.2f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("races", nargs="+", type=Path, help="race folders (runs/jagg.db or history/)")
    p.add_argument("--baseline", default="f-exact", help="the variant the others are measured against")
    args = p.parse_args()
    print("\n".join(table(mean_square_norms(args.races), args.baseline)))


if __name__ == "__main__":
    main()

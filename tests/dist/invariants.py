"""The composed Trainer's invariants on two processes under `accelerate launch` (gloo).

Four combinations (exact / jagg × fixed / sliding window, shared group noise, micro-batches on jagg): each rank
builds the Trainer with the shared Accelerator and runs ``check_step`` of tests/test_trainer_invariants.py on
its own share (grid, SDE noise recovered and independent of z_0, on-policy ratio, counts, logged window); then
the ranks' SDE noise and initial noise must be independent of each other. Rank 0 writes one JSON to argv[1]:
per combination the ranks that passed, every failure and the cross-rank correlation with its bound.
"""

import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the invariants module

from test_trainer_invariants import TINY, Spy, check_step, corr, make_trainer  # noqa: E402

COMBOS = [
    ["strategy=exact", "sde_window_schedule=fixed", "window=3"],
    ["strategy=exact", "sde_window_schedule=sliding"],
    ["strategy=jagg", "sde_window_schedule=fixed", "window=3", "train_micro_batch=1"],
    ["strategy=jagg", "sde_window_schedule=sliding", "rollout_micro_batch=1"],
]


def main(out: str) -> None:
    acc = Accelerator(cpu=True)
    report = []
    for k, combo in enumerate(COMBOS):
        folder = Path(tempfile.mkdtemp(prefix=f"inv{k}-")) if acc.is_main_process else Path(tempfile.mkdtemp())
        failure, mine = None, None
        try:
            overrides = [*TINY, "processes=2", "group_noise=shared", *combo]
            trainer = make_trainer(folder, overrides, accelerator=acc)
            mine = check_step(trainer, Spy(trainer))
        except Exception:
            failure = traceback.format_exc(limit=3)
        parts = gather_object([(acc.process_index, failure, None if mine is None else mine["eps"][0], mine)])
        if acc.is_main_process:
            ranks = [r for r, f, _, _ in parts if f is None]
            cross, bound = float("nan"), 0.0
            if len(ranks) == 2:
                (_, _, eps0, m0), (_, _, eps1, m1) = parts
                cross = max(abs(corr(eps0, eps1)), abs(corr(m0["z0"], m1["z0"])), abs(corr(eps1, m0["z0"])))
                bound = m0["bound"]
            report.append(
                {
                    "combo": combo,
                    "ranks": ranks,
                    "failures": [f for _, f, _, _ in parts if f],
                    "cross_rank_corr": cross,
                    "bound": bound,
                }
            )
        torch.distributed.barrier()
    if acc.is_main_process:
        Path(out).write_text(json.dumps({"combos": report}))


if __name__ == "__main__":
    main(sys.argv[1])

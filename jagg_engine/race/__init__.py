"""`jagg race`: time to quality. Variants of one config trained side by side; eval reward against training time.

    jagg race CONFIG --variant NAME:key=value,... [--variant ...] --seeds 0,1,2 --out DIR [key=value ...]
    jagg race --report-only --out DIR [--baseline NAME]

Each variant is the config with its own ``key=value`` overrides on top of the trailing ones (which apply to
every variant, as ``jagg train`` takes them; a variant's own value wins); the FIRST variant is the baseline.
Every (variant, seed) config is validated before anything starts: a bad spec or field is one line naming the
variant, and nothing is written. Variants must measure the eval alike (every field of :data:`EVAL_FIELDS`:
eval prompts, seeds, rewards, sampling steps, shift, schedule, cfg_scale, backbone and its options, model_path,
precision) and evaluate at the same steps (the same ``eval_every`` >= 1: a variant with cheaper steps and
its own eval_every would get denser eval points in time, which favours it at a first crossing).

Schedule: one heat per seed, heats one after the other. In a heat the variants start together, each with an
equal share of the CPU cores as torch threads (``OMP_NUM_THREADS``/``MKL_NUM_THREADS``), the rule the app uses
for a compare pair (:func:`jagg_engine.processes.plan_pair` with one run per variant); on a GPU machine, or with fewer
cores than training processes, they run one after the other (``--threads N`` forces side by side at N
threads each). Every run is a ``jagg train --run-id`` process in its own process group, in the store
``DIR/runs/jagg.db``; Ctrl-C (or SIGTERM) stops them all cooperatively (each finishes its step, saves and
reads ``cancelled``), a second Ctrl-C kills them.

Faults: no trainer outlives the race's process (the driver), even one killed with SIGKILL: a watchdog
process stops every trainer's process group once the driver is gone (SIGTERM, SIGKILL ``ORPHAN_GRACE_S``
later), and each trainer has SIGTERM as its parent-death signal. The driver holds an exclusive
``fcntl.flock`` on ``DIR/.race.lock`` for its life, so one race runs per folder (:func:`claim_out`) and a
race.json that reads ``running`` while nobody holds the lock belongs to a driver that is gone: the next
``--report-only`` or ``jagg runs`` marks it ``interrupted`` (:func:`driver_gone`), and a report of a race
that did not finish every planned run says it is partial (:func:`race_state`).

Time axis: the trainer's ``time/train_elapsed`` (wall seconds of training from step 1 to the end of a step's
update, evals left out; :class:`jagg_engine.train.trainer.TrainingClock`), logged every step in the store, so
:func:`report` rebuilds every figure from ``DIR/runs/jagg.db`` and the run ids in ``DIR/race.json``.

Time to quality: the level is the baseline's final seed-mean eval reward. A variant's seed-mean curve is the
mean over its seeds of (training time, eval reward) at each eval step they share; its time to the level is
the FIRST CROSSING of the piecewise-linear curve through those points (:func:`time_to_reach`: linear
interpolation between the last eval below the level and the first at or above it; a curve that starts at or
above it reaches it at its first point; one that never does has no time). The spread over seeds is each
seed's own curve against the same level: per-seed times, their mean and min–max, and how many seeds reached
it. The ratio is that time over the baseline's seed-mean training time at its final eval.

Outputs in DIR: ``race.json`` (plan, runs, curves, figures), ``race.svg`` (the curves, a self-contained file
a README shows), ``race.md`` (the Markdown table, also printed). ``--report-only --baseline NAME`` measures
against another variant (race-vs-NAME.*). No torch here; the trainers are processes.

The modules: :mod:`.plan` (specs, checks, schedule), :mod:`.heats` (the trainers and the watchdog),
:mod:`.summary` (curves, times, the table), :mod:`.figure` (the SVG), :mod:`.report` (the outputs rebuilt
from the runs), :mod:`.folder` (one race per folder, a driver that is gone), :mod:`.command` (the CLI).
"""

from .command import add_arguments, run
from .figure import race_svg
from .folder import check_runs_folder, claim_out, driver_gone, race_state
from .heats import ORPHAN_GRACE_S, STOP_GRACE_S, race
from .plan import (
    EVAL_FIELDS,
    LOCK_NAME,
    RACE_JSON,
    RACE_MD,
    RACE_SVG,
    RaceError,
    Variant,
    check_variants,
    parse_seeds,
    parse_variant,
    schedule,
    split_overrides,
)
from .report import report
from .summary import METHOD, Curve, eval_curve, markdown_table, mean_curve, summarise, time_to_reach

__all__ = [
    "EVAL_FIELDS",
    "LOCK_NAME",
    "METHOD",
    "ORPHAN_GRACE_S",
    "RACE_JSON",
    "RACE_MD",
    "RACE_SVG",
    "STOP_GRACE_S",
    "Curve",
    "RaceError",
    "Variant",
    "add_arguments",
    "check_runs_folder",
    "check_variants",
    "claim_out",
    "driver_gone",
    "eval_curve",
    "markdown_table",
    "mean_curve",
    "parse_seeds",
    "parse_variant",
    "race",
    "race_state",
    "race_svg",
    "report",
    "run",
    "schedule",
    "split_overrides",
    "summarise",
    "time_to_reach",
]

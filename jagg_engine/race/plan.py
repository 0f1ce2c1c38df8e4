"""The race's plan and its checks: variant specs, seeds, every (variant, seed) config validated before
anything starts, the eval measured alike, and the schedule of a heat (side by side or one after the other)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jagg_engine.errors import UsageError
from jagg_engine.processes import (
    SIDE_BY_SIDE,
    PairPlan,
    gpu_present,
    plan_pair,
    usable_cores,
)

RACE_JSON, RACE_SVG, RACE_MD = "race.json", "race.svg", "race.md"
HISTORY_DIR = "history"  # each run's run.json and history.jsonl.gz: what a report needs, without runs/
LOCK_NAME = ".race.lock"  # held (fcntl.flock) by the race's driver for its whole life: one race per folder
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
RACE_SET = ("seed", "name")  # fields the race sets itself (from --seeds and the variant's name)
# Fields the eval depends on: variants that differ in one would not be scored on the same measure.
EVAL_FIELDS = (
    "eval_prompts_file",
    "eval_num_prompts",
    "eval_seeds",
    "rewards",
    "reward_options",
    "sampling_steps",
    "shift",
    "schedule",
    "cfg_scale",
    "backbone",
    "backbone_options",
    "model_path",
    "precision",
    "eval_every",
)


def _eval_value(cfg: Any, key: str) -> Any:
    """What field ``key`` of ``cfg`` means for the eval: ``schedule`` as resolved (null = the backbone's
    default), every other field as set."""
    return cfg.resolved_schedule() if key == "schedule" else getattr(cfg, key)


class RaceError(RuntimeError):
    """A race that could not finish (a run failed, the store holds no such race); one line."""


# ------------------------------------------------------------------------------------------------ specs


@dataclass(frozen=True)
class Variant:
    """One contestant: a name and its ``key=value`` overrides of the config."""

    name: str
    overrides: tuple[str, ...]


def split_overrides(text: str) -> list[str]:
    """``key=value,key=value`` → items, split at commas outside YAML flow brackets: ``eval_seeds=[0,1]`` and
    ``rewards={a: 1, b: 2}`` stay whole. ``\\,`` is a literal comma in a plain value. ValueError (one line)
    on unbalanced brackets."""
    items, buf, depth, i = [], [], 0, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] == ",":
            buf.append(",")
            i += 2
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {c!r} in {text!r}")
        if c == "," and depth == 0:
            items.append("".join(buf))
            buf = []
        else:
            buf.append(c)
        i += 1
    if depth:
        raise ValueError(f"unclosed bracket in {text!r}")
    items.append("".join(buf))
    return [item.strip() for item in items if item.strip()]


def parse_variant(text: str) -> Variant:
    """``NAME:key=value,...`` → :class:`Variant`; UsageError (one line naming the spec) otherwise."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep:
        raise UsageError(f"--variant {text!r}: must look like NAME:key=value,... (e.g. exact:strategy=exact)")
    if not NAME_RE.match(name):
        raise UsageError(
            f"--variant {text!r}: the name must be 1-64 letters, digits or _ . + - (starting with a letter or"
            f" digit), got {name!r}"
        )
    try:
        overrides = split_overrides(rest)
    except ValueError as exc:
        raise UsageError(f"variant {name!r}: {exc}") from None
    for item in overrides:
        key, eq, _ = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"variant {name!r}: {item!r} must look like key=value")
    return Variant(name, tuple(overrides))


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` → [0, 1, 2]: distinct integers; UsageError otherwise."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise UsageError(f"seeds: a comma-separated list of integers, e.g. 0,1,2; got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"seeds: must not repeat a seed, got {text!r}")
    return seeds


def _keys(overrides: Sequence[str]) -> set[str]:
    return {item.partition("=")[0].strip() for item in overrides}


def check_variants(
    config: str | None, common: Sequence[str], variants: Sequence[Variant], seeds: Sequence[int]
) -> dict[tuple[str, int], Any]:
    """The validated TrainConfig of every (variant, seed): config ← trailing overrides ← the variant's, with
    ``seed`` and ``name`` set by the race. Every variant is checked before this returns; the first problem is
    a UsageError naming the variant and the field."""
    from jagg_engine.train.config import ConfigError, load_config

    if len(variants) < 2:
        raise UsageError(
            "variant: a race needs at least two --variant NAME:key=value,... (the first is the baseline)"
        )
    names = [v.name for v in variants]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"variant {name!r}: given twice; each variant needs its own name")
    hint = {"seed": "--seeds", "name": "the variant name"}
    if fixed := sorted(_keys(common) & set(RACE_SET)):
        raise UsageError(f"{fixed[0]}: set by the race ({hint[fixed[0]]}); drop it")
    configs: dict[tuple[str, int], Any] = {}
    for v in variants:
        if fixed := sorted(_keys(v.overrides) & set(RACE_SET)):
            raise UsageError(f"variant {v.name!r}: {fixed[0]}: set by the race ({hint[fixed[0]]}); drop it")
        for seed in seeds:
            try:
                cfg = load_config(
                    config, [*common, *v.overrides, f"seed={seed}", f"name={v.name}-seed{seed}"]
                )
            except ConfigError as exc:
                raise UsageError(f"variant {v.name!r}: {exc}") from None
            if not cfg.eval_every:
                raise UsageError(
                    f"variant {v.name!r}: eval_every: the race reads the eval reward; must be >= 1, got 0"
                )
            configs[(v.name, seed)] = cfg
    base = configs[(variants[0].name, seeds[0])]
    for v in variants[1:]:
        cfg = configs[(v.name, seeds[0])]
        for key in EVAL_FIELDS:
            if _eval_value(cfg, key) != _eval_value(base, key):
                raise UsageError(
                    f"variant {v.name!r}: {key}: {_eval_value(cfg, key)!r} differs from the baseline's"
                    f" {_eval_value(base, key)!r}; the eval reward must be measured alike in every variant"
                )
        source = (cfg.eval_prompts_file or cfg.prompts_file, base.eval_prompts_file or base.prompts_file)
        if source[0] != source[1]:
            raise UsageError(
                f"variant {v.name!r}: prompts_file: the eval reads it (eval_prompts_file is null) and it differs"
                f" from the baseline's ({source[0]!r} vs {source[1]!r})"
            )
    return configs


def schedule(configs: Mapping[tuple[str, int], Any], variants: int, threads: int | None) -> PairPlan:
    """How a heat runs: :func:`jagg_engine.processes.plan_pair`'s rule for ``variants`` runs at once on this machine, or side
    by side at ``threads`` torch threads each when given."""
    processes = max(int(cfg.processes) for cfg in configs.values())
    if threads is not None:
        return PairPlan(SIDE_BY_SIDE, threads, f"{threads} CPU thread(s) each, as --threads asked")
    return plan_pair(processes, usable_cores(), gpu_present(), runs=variants)

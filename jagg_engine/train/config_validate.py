"""The checks of a config, by section, and the values each field allows.

:meth:`jagg_engine.train.config.TrainConfig.validate` runs them in this order (each a method of
:class:`ConfigChecks`, which TrainConfig inherits): ``check_ranges`` (types and ranges every field gets from its
declaration), then one method a section — ``validate_run``, ``validate_model``, ``validate_reward``,
``validate_sampler``, ``validate_batches``, ``validate_update`` — and, unless ``check_environment=False``,
``validate_environment`` (what depends on this machine). Each raises :class:`ConfigError` with a one-line message that names the field and the
allowed values on the first bad one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from pathlib import Path
from typing import Any

from jagg_engine.sde_kinds import SDE_KINDS
from jagg_engine.train.config_files import PROMPT_SUFFIXES, model_path_kind, read_prompts
from jagg_engine.train.config_parse import (
    INT_MAX,
    ConfigError,
    _brief,
    _coerce,
    _one_line,
    _split_optional,
    check_options,
)

# The registered SDE kinds (a live view of jagg_engine.sde_kinds.SDE_KINDS: a kind registered later is in it).
ALGORITHMS = SDE_KINDS.keys()
STRATEGIES = ("exact", "jagg", "endpoint", "pair")
SWITCH_TO = ("exact", "pair")  # the backward outside jagg_from_step / jagg_until_step's span
ENDPOINT_BACKWARDS = ("joint", "sequential")
FAR_CREDITS = ("own", "cross")  # jagg_engine.update_config.FAR_CREDITS, without torch
ADV_STDS = ("group", "global", "centered", "group-unbiased")  # jagg_engine.grpo.ADV_STDS, without torch
SCHEDULES = ("pipeline", "shifted-linear")
PRECISIONS = ("fp32", "bf16")
WINDOW_SCHEDULES = ("fixed", "sliding", "random")
MOVING_WINDOWS = ("sliding", "random")  # schedules whose window is `window` steps that move between steps
GROUP_NOISES = ("independent", "shared")
NAME_MAX = 200  # characters of a run name (one line, shown in tables and dropdowns)
# Bounds of every float field: (low, high, low_included). A value outside is refused in one line; past these the
# update or the sampler blows up (lr = 1e308 gives non-finite weights in one step) or the setting is a typo.
# Fields with a null option are bounded when set. A test holds every float field to this table.
FLOAT_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "lr": (0.0, 1.0, False),
    "weight_decay": (0.0, 1.0, True),
    "grad_clip": (0.0, 1e4, False),
    "clip_range": (0.0, 1.0, False),
    "adv_clip": (0.0, 1e3, False),
    "beta": (0.0, 1e3, True),
    "eta": (0.0, 10.0, False),
    "shift": (0.0, 100.0, False),
    "cfg_scale": (0.0, 100.0, False),
    "lora_alpha": (0.0, 1e5, False),
    "jagg_frac": (0.0, 1.0, True),
    "cv_frac": (0.0, 1.0, True),
    "pair_cv": (0.0, 1.0, True),
    "pair_frac": (0.0, 1.0, False),
    "alpha_scale": (0.0, 1.0, True),
    "auto_route_threshold": (-1.0, 1.0, True),
}
REWARD_WEIGHT_MAX = 1e3  # |weight| of each reward
# Fields that only some backbones read (their registry entry's ``options``, jagg_engine.backbones.registry); a
# non-default value on another backbone would be silently ignored, so the validator refuses it.
MODEL_FIELDS = ("model_path", "lora_rank", "lora_alpha", "lora_targets", "gradient_checkpointing", "precision",
                "cfg_scale", "lora_path")  # fmt: skip


# ---------------------------------------------------------------------- the sections


class ConfigChecks:
    """The checks of a config, one method a section; :class:`jagg_engine.train.config.TrainConfig` inherits
    them and :meth:`~jagg_engine.train.config.TrainConfig.validate` runs them (so this module never needs the
    config class: the config is ``self``)."""

    def validate_run(self) -> None:
        """name, output_dir."""
        _nonempty_str("name", self.name)
        if len(self.name) > NAME_MAX or not self.name.isprintable():
            raise ConfigError(
                f"name: must be one line of at most {NAME_MAX} printable characters, got {self.name[:40]!r}"
            )
        _nonempty_str("output_dir", self.output_dir)
        if not self.output_dir.isprintable():
            raise ConfigError(
                "output_dir: must be a folder path of printable characters (no newline, tab or control"
                f" character), got {_brief(self.output_dir)}"
            )

    def validate_model(self) -> None:
        """backbone (a registered name), LoRA fields, precision, and the model fields this backbone reads."""
        self._backbone_spec()
        _bounded("lora_alpha", self.lora_alpha)
        if self.lora_targets and self.lora_rank == 0:
            raise ConfigError(
                "lora_targets: only used with LoRA; set lora_rank > 0 or leave lora_targets empty"
            )
        _one_of("precision", self.precision, PRECISIONS)
        self.check_backbone_fields()
        if self.lora_path is not None and self.lora_rank == 0:
            raise ConfigError("lora_path: a LoRA to start from needs LoRA; set lora_rank to its rank")
        if self.fsdp and self.processes == 1:
            raise ConfigError("fsdp: shards the model across processes; needs processes > 1, got processes 1")

    def check_backbone_fields(self) -> None:
        """Refuse model fields the backbone would ignore and backbone_options it does not take."""
        from jagg_engine.backbones import BACKBONES

        mapped = self._backbone_spec().options
        defaults = type(self)()
        for name in MODEL_FIELDS:
            if getattr(self, name) != getattr(defaults, name) and name not in mapped.values():
                users = [b for b, spec in BACKBONES.items() if name in spec.options.values()]
                raise ConfigError(
                    f"{name}: backbone {self.backbone!r} does not use it (only {', '.join(users) or 'none'}); "
                    f"leave it at {_show(getattr(defaults, name))}"
                )
        if self.backbone_options:
            factory = self._backbone_spec().factory_fn()
            check_options("backbone_options", factory, self.backbone_options, reserved=dict(mapped))

    def validate_reward(self) -> None:
        """Prompt sources, eval seeds and prompt count, reward names and weights, reward_options."""
        from jagg_engine.rewards.registry import _REGISTRY, available_rewards

        backbone = self._backbone_spec()
        for key in ("prompts_file", "eval_prompts_file"):
            path = getattr(self, key)
            if path is not None and not str(path).endswith(PROMPT_SUFFIXES):
                raise ConfigError(f"{key}: must be a .txt or .jsonl file, got {_brief(path)}")
        if self.prompts_file is None and not backbone.procedural_prompts:
            from jagg_engine.backbones import BACKBONES

            procedural = [name for name, spec in BACKBONES.items() if spec.procedural_prompts]
            raise ConfigError(
                f"prompts_file: required for backbone {self.backbone!r} (procedural prompts only suit "
                f"{', '.join(procedural)})"
            )
        if not self.eval_seeds:
            raise ConfigError("eval_seeds: must be a non-empty list of integers, got []")
        if len(set(self.eval_seeds)) != len(self.eval_seeds):
            raise ConfigError(f"eval_seeds: must not repeat a seed, got {self.eval_seeds}")
        if backbone.prompts is not None and self.eval_prompts_file is None and self.prompts_file is None:
            from jagg_engine.plugins import resolve

            n_prompts = len(resolve(backbone.prompts)())
            if self.eval_num_prompts > n_prompts:
                raise ConfigError(
                    f"eval_num_prompts: must be at most the {n_prompts} {self.backbone} prompts, "
                    f"got {self.eval_num_prompts}"
                )

        if not self.rewards:
            raise ConfigError("rewards: must name at least one reward, e.g. rewards={shapes-dense: 1.0}")
        known = available_rewards()
        for reward, weight in self.rewards.items():
            if reward not in known:
                raise ConfigError(
                    f"rewards: unknown reward {_brief(reward)}; allowed: {', '.join(known) or '(none)'}"
                )
            if not (math.isfinite(weight) and abs(weight) <= REWARD_WEIGHT_MAX):
                raise ConfigError(
                    f"rewards: weight of {_brief(reward)} must be a number in [-{REWARD_WEIGHT_MAX:g},"
                    f" {REWARD_WEIGHT_MAX:g}], got {weight}"
                )
        if all(w == 0 for w in self.rewards.values()):
            raise ConfigError("rewards: at least one weight must be non-zero")
        for reward in self.reward_options:
            if reward not in self.rewards:
                raise ConfigError(
                    f"reward_options: {_brief(reward)} is not in rewards; allowed: {', '.join(self.rewards)}"
                )
        for reward, options in self.reward_options.items():
            check_options(f"reward_options.{reward}", _REGISTRY[reward].factory, options)
        if "picks" in self.rewards:
            self.validate_picks()

    def validate_picks(self) -> None:
        """The ``picks`` reward: one process asks, its options, and no more groups asked than a step has."""
        from jagg_engine.rewards.registry import _REGISTRY, RewardConfigError

        if self.processes != 1:
            raise ConfigError(
                f"rewards: picks asks its person from one process; needs processes 1, got {self.processes}"
            )
        options = self.reward_options.get("picks", {})
        try:
            _REGISTRY["picks"].check(**options)
        except RewardConfigError as exc:
            raise ConfigError(f"reward_options.picks: {exc}") from None
        per_step = options.get("picks_per_step", 4)
        if per_step != "all" and per_step > self.prompts_per_step:
            raise ConfigError(
                f"reward_options.picks.picks_per_step: {per_step} is more than the {self.prompts_per_step} groups"
                " of a step (prompts_per_step); 'all' asks about every group"
            )

    def validate_sampler(self) -> None:
        """algorithm (a registered SDE kind), eta, shift, cfg_scale, the SDE window."""
        kind = self._sde_kind()
        _bounded("eta", self.eta)
        if kind.max_eta is not None and self.eta > kind.max_eta:
            raise ConfigError(f"eta: {self.algorithm} needs 0 < eta <= {kind.max_eta:g}, got {self.eta}")
        _bounded("shift", self.shift)
        if self.schedule is not None:
            _one_of("schedule", self.schedule, SCHEDULES)
        if self.resolved_schedule() == "pipeline":
            if not self._backbone_spec().pipeline_schedule:
                raise ConfigError(
                    f"schedule: backbone {self.backbone!r} has no diffusers pipeline scheduler; allowed: shifted-linear"
                )
            if self.shift != 1.0:
                raise ConfigError(
                    f"shift: the pipeline schedule takes its shift from the model's scheduler; leave shift at 1"
                    f" or set schedule=shifted-linear, got shift {self.shift:g}"
                )
        _bounded("cfg_scale", self.cfg_scale)
        start, end = self.sde_window()
        if not 0 <= start < self.sampling_steps:
            raise ConfigError(
                f"sde_window_start: must be in 0..{self.sampling_steps - 1} (sampling_steps - 1), got {start}"
            )
        last = self.sampling_steps - (0 if kind.last_step_stochastic else 1)
        if not start < end <= last:
            limit = (
                "sampling_steps"
                if kind.last_step_stochastic
                else f"sampling_steps - 1 for {self.algorithm}, whose last step is not stochastic"
            )
            raise ConfigError(
                f"sde_window_end: must be in {start + 1}..{last} (after sde_window_start, at most {limit}), got {end}"
            )
        _one_of("sde_window_schedule", self.sde_window_schedule, WINDOW_SCHEDULES)
        _one_of("group_noise", self.group_noise, GROUP_NOISES)
        from jagg_engine.sde import ODE_SOLVERS

        _one_of("ode_solver", self.ode_solver, ODE_SOLVERS)
        if self.window_last_start is not None and self.sde_window_schedule not in MOVING_WINDOWS:
            raise ConfigError(
                "window_last_start: only used with sde_window_schedule sliding or random; set it to null or use"
                " one of them"
            )
        if self.sde_window_schedule in MOVING_WINDOWS and self.window <= end - start:
            first, fits = start, end - self.window
            if not first <= self.window_last() <= fits:
                raise ConfigError(
                    f"window_last_start: must be in {first}..{fits} (sde_window_start .. sde_window_end - window),"
                    f" got {self.window_last_start}"
                )

    def validate_batches(self) -> None:
        """prompts_per_step over processes, max_batch, rollout_micro_batch, train_micro_batch,
        updates_per_rollout."""
        if self.prompts_per_step % self.processes:
            raise ConfigError(
                f"prompts_per_step: must be a multiple of processes ({self.processes}), got {self.prompts_per_step}"
            )
        per_process = self.group_size * self.prompts_per_step // self.processes
        if per_process > self.max_batch:
            raise ConfigError(
                f"group_size: group_size × prompts_per_step / processes = {per_process} samples per process is "
                f"over max_batch ({self.max_batch}); lower them, or raise max_batch on a machine with the memory"
            )
        eval_samples = self.eval_num_prompts * len(self.eval_seeds)
        if eval_samples > self.max_batch:
            raise ConfigError(
                f"eval_num_prompts: eval_num_prompts × len(eval_seeds) = {eval_samples} eval samples is over "
                f"max_batch ({self.max_batch}); lower them, or raise max_batch on a machine with the memory"
            )
        for key in ("rollout_micro_batch", "train_micro_batch"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key}: must be an integer >= 1 or null (the whole batch), got {value}")
        _int_at_least("updates_per_rollout", self.updates_per_rollout, 1)
        if self.rank_batch % self.updates_per_rollout:
            raise ConfigError(
                f"updates_per_rollout: must divide the {self.rank_batch} samples of a rank's step"
                f" (prompts_per_step / processes × group_size), got {self.updates_per_rollout}"
            )

    def validate_update(self) -> None:
        """strategy, window, routing, reuse, the optimizer and the GRPO loss, the probe."""
        from jagg_engine.grpo import KL_FORMS
        from jagg_engine.sde import CPS_LOG_PROBS

        _one_of("strategy", self.strategy, STRATEGIES)
        if self.window < 2 and self.strategy != "exact":
            raise ConfigError(
                f"window: must be an integer >= 2 for strategy {self.strategy} (a one-step window trains with"
                f" strategy=exact), got {self.window}"
            )
        start, end = self.sde_window()
        if self.window > end - start:
            raise ConfigError(
                f"window: must be at most the number of trained steps "
                f"({end - start} = sde_window_end - sde_window_start), got {self.window}"
            )
        _bounded("jagg_frac", self.jagg_frac)
        _bounded("cv_frac", self.cv_frac)
        _bounded("pair_cv", self.pair_cv)
        _bounded("pair_frac", self.pair_frac)
        _bounded("alpha_scale", self.alpha_scale)
        if self.alpha_scale != 1.0 and self.strategy != "jagg":
            raise ConfigError(
                f"alpha_scale: weighs JAGG's endpoints; needs strategy jagg, got strategy {self.strategy!r}"
                " (use alpha_scale=1)"
            )
        _one_of("far_credit", self.far_credit, FAR_CREDITS)
        if self.far_credit == "cross":
            why = (
                f"strategy {self.strategy!r}"
                if self.strategy != "jagg"
                else f"cv_frac {self.cv_frac}"
                if self.cv_frac > 0
                else f"updates_per_rollout {self.updates_per_rollout} (mini-batches split groups)"
                if self.updates_per_rollout > 1
                else f"group_size {self.group_size}"
                if self.group_size < 2
                else f"train_micro_batch {self.train_micro_batch}, not a multiple of group_size {self.group_size}"
                if self.train_micro_batch is not None and self.train_micro_batch % self.group_size
                else None
            )
            if why:
                raise ConfigError(
                    "far_credit: cross needs strategy jagg, cv_frac 0, updates_per_rollout 1, group_size >= 2 and"
                    f" whole groups in each micro-batch; got {why} (use far_credit=own)"
                )
        _one_of("switch_to", self.switch_to, SWITCH_TO)
        if self.switch_to != "exact" and self.jagg_from_step is None and self.jagg_until_step is None:
            raise ConfigError(
                f"switch_to: the backward outside JAGG's span; needs jagg_from_step or jagg_until_step, got"
                f" switch_to {self.switch_to!r} with neither (use switch_to=exact)"
            )
        if self.pair_frac < 1 and "pair" not in (self.strategy, self.switch_to):
            raise ConfigError(
                f"pair_frac: the share of samples strategy pair draws; needs strategy pair or switch_to pair, got"
                f" strategy {self.strategy!r} (use pair_frac=1)"
            )
        if self.jagg_until_step is not None and self.strategy != "jagg":
            raise ConfigError(
                f"jagg_until_step: switches from jagg to exact; needs strategy jagg, got strategy {self.strategy!r}"
                " (use jagg_until_step=null)"
            )
        if self.jagg_from_step is not None and self.strategy != "jagg":
            raise ConfigError(
                f"jagg_from_step: switches from exact to jagg; needs strategy jagg, got strategy {self.strategy!r}"
                " (use jagg_from_step=null)"
            )
        if (
            None not in (self.jagg_from_step, self.jagg_until_step)
            and self.jagg_from_step >= self.jagg_until_step
        ):
            raise ConfigError(
                f"jagg_from_step: must be below jagg_until_step ({self.jagg_until_step}) so that some step trains"
                f" by jagg, got {self.jagg_from_step}"
            )
        if self.cv_frac > 0 and self.strategy != "jagg":
            raise ConfigError(
                f"cv_frac: corrects JAGG's estimate; needs strategy jagg, got strategy {self.strategy!r} (use cv_frac=0)"
            )
        _one_of("endpoint_backward", self.endpoint_backward, ENDPOINT_BACKWARDS)
        _one_of("reuse_rollout_velocity", self.reuse_rollout_velocity, ("off", "auto"))
        _bounded("auto_route_threshold", self.auto_route_threshold)
        if self.fsdp and (self.probe_every > 0 or self.auto_route):
            raise ConfigError(
                "fsdp: the gradient probe (probe_every, auto_route) does not run on sharded weights;"
                " set probe_every=0 and auto_route=false"
            )
        if self.auto_route and self.strategy != "jagg":
            raise ConfigError(f"auto_route: needs strategy jagg, got strategy {self.strategy!r}")
        for key in ("lr", "weight_decay", "grad_clip", "clip_range", "adv_clip"):
            _bounded(key, getattr(self, key))
        _one_of("adv_std", self.adv_std, ADV_STDS)
        _bounded("beta", self.beta)
        _one_of("kl_form", self.kl_form, KL_FORMS)
        _one_of("cps_log_prob", self.cps_log_prob, CPS_LOG_PROBS)
        if self.probe_every and self.strategy == "exact":
            raise ConfigError("probe_every: probes compare JAGG with exact; needs strategy jagg or endpoint")

    def validate_environment(self) -> None:
        """What depends on this machine: prompt files readable and long enough, model_path present and holding
        what the backbone loads, every reward's dependency and weights present."""
        from jagg_engine.rewards.registry import RewardConfigError, check_reward

        for key in ("prompts_file", "eval_prompts_file"):
            path = getattr(self, key)
            if path is not None:
                prompts = read_prompts(path, field_name=key)
                eval_source = key == "eval_prompts_file" or self.eval_prompts_file is None
                if eval_source and len(prompts) < self.eval_num_prompts:
                    raise ConfigError(
                        f"eval_num_prompts: must be at most the {len(prompts)} prompts in "
                        f"{path}, got {self.eval_num_prompts}"
                    )
        if self.model_path is not None and model_path_kind(self.model_path) == "missing":
            raise ConfigError(f"model_path: no such file or folder: {self.model_path}")
        if self.model_path is not None:
            _check_model_folder(self.backbone, self.model_path)
        if self.lora_path is not None:
            from jagg_engine.export_format import missing_lora_files

            missing = missing_lora_files(Path(self.lora_path).expanduser())
            if missing:
                raise ConfigError(
                    f"lora_path: {self.lora_path} holds no LoRA export (missing {', '.join(missing)}); pass a"
                    " folder written by `jagg export-model` from a LoRA run"
                )
        for reward in self.rewards:
            try:
                check_reward(reward, **self.reward_options.get(reward, {}))
            except RewardConfigError as exc:
                raise ConfigError(f"rewards: {_one_line(str(exc))}") from None

    def check_ranges(self) -> None:
        """Types and ranges every field gets from its declaration: each value re-parsed as its type (a config
        built in code is held to the same types as one read from YAML), every integer (also inside lists and
        mappings) in [low, high] of the field's metadata (default 0..INT_MAX), every float finite."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _coerce(f.name, hints[f.name], getattr(self, f.name))
            low, high = f.metadata.get("low", 0), f.metadata.get("high", INT_MAX)
            _check_value(f.name, hints[f.name], value, low, high)


# ---------------------------------------------------------------------- range checks


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: must be one of {', '.join(allowed)}, got {_brief(value)}")


def _int_at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key}: must be an integer >= {low}, got {value}")


def _bounded(key: str, value: float | None) -> None:
    """``value`` within FLOAT_BOUNDS[key] (None, for a field whose null means "off", passes)."""
    if value is None:
        return
    low, high, closed = FLOAT_BOUNDS[key]
    inside = (low <= value if closed else low < value) and value <= high
    if not (math.isfinite(value) and inside):
        raise ConfigError(
            f"{key}: must be a number in {'[' if closed else '('}{low:g}, {high:g}], got {value}"
        )


def _nonempty_str(key: str, value: str) -> None:
    if not value.strip():
        raise ConfigError(f"{key}: must be a non-empty string")


def _show(value: Any) -> str:
    return (
        "null"
        if value is None
        else json.dumps(value)
        if isinstance(value, (list, dict, bool))
        else str(value)
    )


def _check_value(key: str, tp: Any, value: Any, low: int, high: int) -> None:
    base, optional = _split_optional(tp)
    null = " or null" if optional else ""
    if value is None:
        return
    origin = typing.get_origin(base)
    if origin is list:
        (item,) = typing.get_args(base)
        for i, v in enumerate(value):
            _check_value(f"{key}[{i}]", item, v, low, high)
    elif origin is dict:
        _, vtype = typing.get_args(base)
        for k, v in value.items():
            _check_value(f"{key}.{k}", vtype, v, low, high)
    elif base is int:
        if value < low:
            raise ConfigError(f"{key}: must be an integer >= {low}{null}, got {value}")
        if value > high:
            raise ConfigError(f"{key}: must be an integer <= {high}{null}, got {value}")
    elif base is float and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value}")


def _check_model_folder(backbone: str, model_path: str) -> None:
    """A model_path that exists must hold what the backbone loads (its registry entry's ``model_folder``: a
    diffusers pipeline folder, the tiny-shapes weight files); a hub id is left to the backbone's loader."""
    from jagg_engine.backbones import get_backbone
    from jagg_engine.plugins import resolve

    spec = get_backbone(backbone).model_folder
    folder = Path(model_path).expanduser()
    if not os.path.exists(folder):
        if spec is not None and spec.local_only:
            raise ConfigError(f"model_path: {backbone} loads a local folder; no such folder: {model_path}")
        return  # a hub id: the loader fetches it or says why not
    if spec is None:
        return
    try:
        missing = resolve(spec.missing)(folder)
    except (OSError, ValueError) as exc:  # an index file unreadable or not JSON
        raise ConfigError(
            f"model_path: {model_path} holds no readable {backbone} {spec.what}: {_one_line(str(exc))}"
        ) from None
    if missing:
        raise ConfigError(
            f"model_path: {model_path} holds no {backbone} {spec.what} (missing {', '.join(missing)}){spec.hint}"
        )

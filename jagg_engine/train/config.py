"""The one typed config tree of a training run: a flat dataclass, YAML + ``key=value`` overrides, one validator.

Lifecycle::

    cfg = load_config("configs/tiny-shapes-cpu.yaml", ["steps=3", "window=4"])   # parsed + validated
    cfg.sampler_config(), cfg.update_config()                                      # engine objects
    store.create_run(cfg.name, cfg.to_dict(), run_dir)                             # persisted as JSON
    TrainConfig.from_dict(json.loads(run["config"]))                               # resume

Every field carries a help string (``field(metadata={"help": ...})``); :func:`field_table` lists them for
the CLI and the app. Values from YAML and from overrides go through the same typed parser, so ``lr=1e-4`` on
the command line and ``lr: 1e-4`` in YAML (which PyYAML reads as a string) both become a float.

All checks run from :meth:`TrainConfig.validate`, one method a section (run, model, reward, sampler, batches,
update, environment), and raise :class:`ConfigError` with a one-line message that
names the field and the allowed values (diffusers: "concise error messages are preferred to silently
correcting erroneous input"; TRL's ``_config_check``). ``validate(check_environment=False)`` runs only the
checks that depend on the config alone (types, ranges, cross-field constraints, known names);
the default also checks the machine: files exist and every reward's optional dependency and weights are
present (:func:`jagg_engine.rewards.registry.check_reward`, which loads no model).

``model_path``: ``None`` means the backbone's default. A path that exists is accepted. A string shaped like a
Hugging Face hub id (``owner/name``, no leading ``/``, ``./``, ``../`` or ``~``, no file suffix, and whose
first component is not an existing local folder) is accepted without a check — the backbone downloads it or
fails with its own message. Anything else that does not exist is an error. This is what lets the shipped GPU
configs name hub ids and still validate on a machine without the weights.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import inspect
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jagg_engine import safe_yaml
from jagg_engine.sde_kinds import SDE_KINDS, get_sde

# The registered SDE kinds (a live view of jagg_engine.sde_kinds.SDE_KINDS: a kind registered later is in it).
ALGORITHMS = SDE_KINDS.keys()
STRATEGIES = ("exact", "jagg", "endpoint")
ENDPOINT_BACKWARDS = ("joint", "sequential")
ADV_STDS = ("group", "global", "centered", "group-unbiased")  # jagg_engine.grpo.ADV_STDS, without torch
SCHEDULES = ("pipeline", "shifted-linear")
PRECISIONS = ("fp32", "bf16")
WINDOW_SCHEDULES = ("fixed", "sliding", "random")
MOVING_WINDOWS = ("sliding", "random")  # schedules whose window is `window` steps that move between steps
GROUP_NOISES = ("independent", "shared")
PROMPT_SUFFIXES = (".txt", ".jsonl")
_WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt", ".bin", ".gguf")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Every integer field lies in [low, high]; the defaults are 0 and INT_MAX (2^31 − 1: a seed, a count or a size
# beyond it is a typo, and 64-bit arithmetic on it — seeds × steps — cannot overflow).
INT_MAX = 2**31 - 1
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
    "auto_route_threshold": (-1.0, 1.0, True),
}
REWARD_WEIGHT_MAX = 1e3  # |weight| of each reward
# Fields that only some backbones read (their registry entry's ``options``, jagg_engine.backbones.registry); a
# non-default value on another backbone would be silently ignored, so the validator refuses it.
MODEL_FIELDS = ("model_path", "lora_rank", "lora_alpha", "lora_targets", "gradient_checkpointing", "precision",
                "cfg_scale", "lora_path")  # fmt: skip


class ConfigError(ValueError):
    """A bad config value; the message is one line naming the field and what is allowed."""


def _f(default: Any, help: str, *, low: int | None = None, high: int | None = None) -> Any:
    """A dataclass field with a help string; mutable defaults are copied per instance.

    ``low`` / ``high`` bound an integer field (or the integers inside a list field); without them every
    integer must lie in 0..INT_MAX (:func:`_check_ranges`), so a new field is range-checked with no code.
    """
    meta: dict[str, Any] = {"help": help}
    if low is not None:
        meta["low"] = low
    if high is not None:
        meta["high"] = high
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: json.loads(json.dumps(d)), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    """One GRPO training run. Defaults are the tiny-shapes CPU setting that learned
    (/work/shared/TINY-SHAPES-NOTES.md, "A GRPO setting that did learn")."""

    # --- run ---
    name: str = _f("tiny-shapes", "Run name shown in `jagg runs` and the app.")
    seed: int = _f(0, "Seed for prompt sampling, initial noise and SDE noise.")
    steps: int = _f(40, "Number of GRPO steps (one rollout + one optimizer step each).", low=1)
    output_dir: str = _f("runs", "Runs root: holds jagg.db and one folder per run.")
    processes: int = _f(1, "Number of training processes (GPUs); > 1 launches through accelerate.", low=1)
    max_batch: int = _f(
        1024,
        "Most samples one process may hold in a step: a rollout's group_size × prompts_per_step / processes and"
        " the eval's eval_num_prompts × len(eval_seeds). A larger config is refused; raise it on a big machine.",
        low=1,
    )

    # --- model ---
    backbone: str = _f("tiny-shapes", "Backbone name (jagg_engine.backbones.registry).")
    model_path: str | None = _f(
        None, "Local folder/file or hub id of the pretrained weights; null = the backbone's default."
    )
    backbone_options: dict[str, Any] = _f({}, "Extra keyword options passed to the backbone factory.")
    plugins: list[str] = _f(
        [],
        "Modules imported before the config is checked, in every process: they register SDE kinds, rewards or"
        " backbones (README, Extending). Each must be importable there (on PYTHONPATH).",
    )
    lora_rank: int = _f(0, "LoRA rank; 0 = full fine-tune of all trainable weights.")
    lora_alpha: float | None = _f(None, "LoRA alpha; null = lora_rank (scale 1).")
    lora_targets: list[str] = _f([], "Module names LoRA wraps; empty = the backbone's default set.")
    lora_path: str | None = _f(
        None,
        "A LoRA export of `jagg export-model` (its folder, holding pytorch_lora_weights.safetensors) that the"
        " adapter starts from instead of B = 0; its rank must be lora_rank. null = a fresh adapter.",
    )
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward to save memory.")
    precision: str = _f("fp32", "Compute precision: fp32 or bf16.")
    fsdp: bool = _f(False, "Shard the model with FSDP across processes.")

    # --- prompts and rewards ---
    prompts_file: str | None = _f(
        None,
        "Training prompts: .txt (one a line) or .jsonl (objects with a 'prompt' key); "
        "null = tiny-shapes procedural prompts.",
    )
    eval_prompts_file: str | None = _f(
        None, "Eval prompts (same formats); null = the training prompt source."
    )
    eval_num_prompts: int = _f(90, "Number of eval prompts (the first N of the eval source).", low=1)
    eval_seeds: list[int] = _f(
        [0, 1], "Seeds of the eval images; each eval prompt is rendered once per seed."
    )
    rewards: dict[str, float] = _f(
        {"shapes-dense": 1.0}, "Reward name → weight; the reward is the weighted sum."
    )
    reward_options: dict[str, dict[str, Any]] = _f({}, "Reward name → keyword options for that reward.")

    # --- sampling (rollout) ---
    algorithm: str = _f("flow-grpo", "SDE sampler: flow-grpo, dance or cps.")
    sampling_steps: int = _f(12, "Number of denoising steps T of a rollout.", low=2, high=1000)
    eta: float = _f(0.7, "SDE noise level η (> 0; cps needs η <= 1).")
    shift: float = _f(1.0, "Timestep shift of the shifted-linear schedule (1 = none).")
    schedule: str | None = _f(
        None,
        "Sampling sigmas: pipeline (the diffusers pipeline's own scheduler: FLUX's dynamic shift from the image"
        " size, SD3's static shift) or shifted-linear (uniform, then shift); null = the backbone's default"
        " (pipeline for flux, sd3 and qwen-image).",
    )
    sde_window_start: int | None = _f(0, "First SDE (trained) step; null = 0.")
    sde_window_end: int | None = _f(
        4, "End (exclusive) of the SDE (trained) steps; null = sampling_steps. Steps outside run as ODE."
    )
    sde_window_schedule: str = _f(
        "fixed",
        "fixed: the SDE window is sde_window_start..sde_window_end every step. sliding (MixGRPO): the window is"
        " `window` consecutive steps inside that range, starting at sde_window_start and moving window_stride"
        " steps toward low noise every window_shift_every training steps; after window_last_start it rolls back."
        " random (Flow-GRPO-Fast, Flash-GRPO): `window` consecutive steps starting at a step drawn uniformly from"
        " sde_window_start..window_last_start each training step (the whole batch, every rank).",
    )
    window_shift_every: int = _f(5, "sliding: training steps between two shifts of the window.", low=1)
    window_stride: int = _f(1, "sliding: sampling steps the window moves per shift.", low=1)
    window_last_start: int | None = _f(
        None,
        "sliding, random: the last window start; null = the last start that fits (sde_window_end - window).",
    )
    group_noise: str = _f(
        "independent",
        "independent: every sample draws its initial noise; shared: the samples of a group share it (DanceGRPO),"
        " and the ODE steps before the SDE window are computed once per group (1/group_size of their forwards).",
    )
    ode_solver: str = _f(
        "dpmpp-2m",
        "Solver of the ODE steps outside the SDE window: euler or dpmpp-2m (diffusers' DPM-Solver++ 2M).",
    )
    ode_steps_before: int | None = _f(
        None,
        "Steps of the ODE part before the SDE window (re-spaced), at most the schedule's own count there;"
        " null = that count.",
        low=1,
    )
    ode_steps_after: int | None = _f(
        4,
        "Steps of the ODE part after the SDE window (re-spaced), at most the schedule's own count there;"
        " null = that count.",
        low=1,
    )
    cfg_scale: float = _f(
        1.0, "Classifier-free guidance scale during rollouts (1 = no guidance); flux: its distilled guidance."
    )
    group_size: int = _f(8, "Samples per prompt (the GRPO group).", low=2)
    prompts_per_step: int = _f(
        18, "Prompts per step; a step has group_size × prompts_per_step samples.", low=1
    )
    rollout_micro_batch: int | None = _f(
        None,
        "Samples per model call while sampling; null = the rank's whole batch. The split changes no sample.",
        low=1,
    )

    # --- update ---
    strategy: str = _f(
        "jagg", "Backward per window: exact (every step), jagg (two endpoints), endpoint (ablation)."
    )
    window: int = _f(
        4,
        "JAGG window W: consecutive trained steps aggregated into one group (>= 2 for jagg and endpoint; exact"
        " takes 1, a one-step window under sliding or random).",
        low=1,
    )
    jagg_frac: float = _f(
        1.0, "Fraction of the windows (high-noise first) that use the strategy; the rest use exact backward."
    )
    cv_frac: float = _f(
        0.0,
        "Control variate (strategy jagg): the fraction of each JAGG window's samples, drawn every step, that also"
        " get the exact - JAGG correction, weighted so that the expected gradient is the exact one (0 = plain"
        " JAGG, biased where the Jacobian is not linear in t; 1 = exact).",
    )
    jagg_until_step: int | None = _f(
        None,
        "Strategy jagg up to and including this training step, then the exact backward of the same window with"
        " the same optimizer state (JAGG's cheap early steps, the exact gradient once the signal is small);"
        " null = jagg throughout.",
        low=1,
    )
    endpoint_backward: str = _f("joint", "JAGG endpoint backward: joint (one autograd call) or sequential.")
    auto_route: bool = _f(
        False,
        "Choose jagg_frac automatically: probe the gradient cosine per group on the first rollout and every"
        " auto_route_every steps, and route to JAGG the leading groups whose cosine is >= auto_route_threshold.",
    )
    auto_route_threshold: float = _f(0.7, "Cosine a group must reach to stay on JAGG under auto_route.")
    auto_route_every: int = _f(10, "Steps between two routing probes under auto_route.", low=1)
    reuse_rollout_velocity: str = _f(
        "auto",
        "auto: JAGG inner steps take the rollout's velocities on the first mini-batch of a rollout, before any"
        " optimizer step or weight load, where the guard finds the policy unchanged (exact; README, When"
        " velocities are reused); off: always a forward.",
    )
    train_micro_batch: int | None = _f(
        None,
        "Samples per forward/backward in the update (the joint JAGG endpoint call holds twice as many);"
        " gradients are accumulated to the mini-batch's exactly; null = the whole mini-batch.",
        low=1,
    )
    updates_per_rollout: int = _f(
        1,
        "Optimizer steps per rollout: the rank's samples are shuffled and split into this many mini-batches,"
        " one step each; on the later ones the policy has moved, so the PPO ratio and clip act.",
        low=1,
    )
    lr: float = _f(5e-5, "AdamW learning rate.")
    weight_decay: float = _f(1e-4, "AdamW weight decay.")
    grad_clip: float | None = _f(1.0, "Gradient-norm clip; null = no clipping.")
    clip_range: float = _f(1e-3, "PPO ratio clip range ε.")
    adv_clip: float | None = _f(5.0, "Clip advantages to ±adv_clip; null = no clipping.")
    adv_std: str = _f(
        "centered",
        "Advantage std: group (per prompt, Flow-GRPO global_std false), global (raw rewards of the whole batch,"
        " Flow-GRPO global_std true), centered (group-centred rewards of the whole batch), group-unbiased"
        " (DanceGRPO). README, Numerics.",
    )
    beta: float = _f(0.0, "KL penalty weight against the reference model (0 = none).")
    kl_form: str = _f(
        "flow-grpo",
        "KL term: flow-grpo (Flow-GRPO's code, so its beta carries over) or gaussian (the step's closed-form"
        " Gaussian KL, 1/|dsigma| times larger for the flow-grpo and dance SDEs).",
    )
    cps_log_prob: str = _f(
        "flow-grpo",
        "CPS log-prob: flow-grpo (-mean squared error, Flow-GRPO's code, so its clip_range carries over) or"
        " gaussian (the full Gaussian log-density).",
    )

    # --- logging and checkpoints (0 = never) ---
    sample_every: int = _f(10, "Save training sample images every N steps.")
    eval_every: int = _f(10, "Run the deterministic (ODE) eval every N steps.")
    checkpoint_every: int = _f(25, "Save a resumable checkpoint every N steps (and at the end).")
    keep_checkpoints: int = _f(
        2, "Keep the newest N checkpoints of a run (older ones are deleted; >= 1).", low=1
    )
    probe_every: int = _f(0, "Measure JAGG-vs-exact gradient fidelity every N steps.")

    # ------------------------------------------------------------------ building
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a mapping (YAML document, stored config JSON); types parsed, not validated."""
        if not isinstance(data, dict):
            raise ConfigError(
                f"config: must be a mapping of field names to values, got {type(data).__name__}"
            )
        hints = _hints()
        values = {}
        for key, raw in data.items():
            key = str(key)
            _check_known(key)
            values[key] = _coerce(key, hints[key], raw)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    def apply_overrides(self, overrides: list[str]) -> TrainConfig:
        """A copy with ``key=value`` overrides applied (scalars parsed by type, lists/dicts as YAML)."""
        hints = _hints()
        values = {}
        for item in overrides:
            size = len(str(item).encode("utf-8", "surrogatepass"))
            if size > safe_yaml.OVERRIDES_MAX_BYTES:  # before any parsing
                raise ConfigError(
                    f"override {_brief(item[:40])}: {size:,} bytes is over the limit of"
                    f" {safe_yaml.OVERRIDES_MAX_BYTES:,} bytes"
                )
            key, sep, text = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ConfigError(f"override {_brief(item)}: must look like name=value")
            _check_known(key)
            values[key] = _coerce(key, hints[key], _parse_text(key, hints[key], text))
        return dataclasses.replace(self, **values)

    # ------------------------------------------------------------------ derived values
    def sde_window(self) -> tuple[int, int]:
        """The trained/SDE steps as a half-open range [start, end) of the sampling steps.

        As in SamplerConfig.sde_steps, a kind whose last step is not stochastic (cps: σ_next = 0 has zero
        variance) never samples it, so with sde_window_end null its window ends at sampling_steps − 1.
        """
        start = 0 if self.sde_window_start is None else self.sde_window_start
        last = self.sampling_steps - (0 if self._sde_kind().last_step_stochastic else 1)
        end = last if self.sde_window_end is None else self.sde_window_end
        return start, end

    def resolved_schedule(self) -> str:
        """``schedule``, or when null the backbone's default: pipeline where its registry entry has a pipeline
        scheduler (``pipeline_schedule``), else shifted-linear."""
        if self.schedule is not None:
            return self.schedule
        return "pipeline" if self._backbone_spec().pipeline_schedule else "shifted-linear"

    def _sde_kind(self) -> Any:
        """The registry entry of ``algorithm``; ConfigError (one line) when it is not registered."""
        try:
            return get_sde(self.algorithm)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def num_trained_steps(self) -> int:
        """Sampling steps trained per training step: the fixed window's length, or W under sliding / random."""
        start, end = self.sde_window()
        return self.window if self.sde_window_schedule in MOVING_WINDOWS else end - start

    @property
    def num_windows(self) -> int:
        """Windows of W trained steps; a remainder shorter than W is the last, partial window (the engine
        treats a one-step group as exact)."""
        return math.ceil(self.num_trained_steps / self.window)

    def window_last(self) -> int:
        """sliding, random: the last window start (window_last_start, or the last start that fits)."""
        end = self.sde_window()[1]
        return end - self.window if self.window_last_start is None else self.window_last_start

    def sde_window_at(self, step: int) -> tuple[int, int]:
        """The SDE window [start, end) of training step ``step`` (from 1): the fixed window, or the sliding one
        (:func:`jagg_engine.sde.sliding_window`), or the random one (its start drawn uniformly from
        sde_window_start .. window_last() by the step's "window" stream, :mod:`jagg_engine.streams`; the same on
        every rank and after a resume). Each is a pure function of (config, step)."""
        if self.sde_window_schedule not in MOVING_WINDOWS:
            return self.sde_window()
        from jagg_engine.sde import sliding_window

        start = self.sde_window()[0]
        if self.sde_window_schedule == "random":
            from jagg_engine.streams import numpy_stream

            first = int(numpy_stream(self.seed, step, 0, "window").integers(start, self.window_last() + 1))
            return first, first + self.window
        return sliding_window(
            step, start, self.window_last(), self.window, self.window_shift_every, self.window_stride
        )

    def sampler_config(self, step: int | None = None) -> Any:
        """The sampler of training step ``step`` (from 1; None = the first): its SDE window moves under sliding.
        ode_steps_before / ode_steps_after are capped at the schedule's own count of ODE steps there, so a
        sliding window near either end never costs more ODE steps than the schedule has."""
        from jagg_engine.sde import SamplerConfig  # lazy: the engine module is owned elsewhere

        all_steps = self.sde_window_start is None and self.sde_window_end is None
        sliding = self.sde_window_schedule in MOVING_WINDOWS
        sampler = SamplerConfig(
            kind=self.algorithm,
            num_steps=self.sampling_steps,
            eta=self.eta,
            shift=self.shift,
            sde_window=None if all_steps and not sliding else self.sde_window_at(step or 1),
            cps_log_prob=self.cps_log_prob,
            ode_solver=self.ode_solver,
        )
        steps = sampler.sde_steps()
        own = (steps[0], self.sampling_steps - steps[-1] - 1) if steps else (0, 0)
        before, after = (
            None if n is None else min(n, m) or None
            for n, m in zip((self.ode_steps_before, self.ode_steps_after), own)
        )
        return dataclasses.replace(sampler, ode_steps_before=before, ode_steps_after=after)

    def jagg_at(self, step: int) -> bool:
        """Whether training step ``step`` trains by JAGG (strategy jagg, before any jagg_until_step switch)."""
        return self.strategy == "jagg" and (self.jagg_until_step is None or step <= self.jagg_until_step)

    def update_config(self, step: int | None = None) -> Any:
        """The update of training step ``step`` (None: the first): after ``jagg_until_step`` the exact backward."""
        from jagg_engine.jagg import UpdateConfig  # lazy: the engine module is owned elsewhere

        if step is not None and self.strategy == "jagg" and not self.jagg_at(step):
            return dataclasses.replace(self.update_config(), strategy="exact", cv_frac=0.0)
        return UpdateConfig(
            strategy=self.strategy,
            window=self.window,
            jagg_frac=self.jagg_frac,
            cv_frac=self.cv_frac,
            endpoint_backward=self.endpoint_backward,
            reuse_rollout_velocity=self.reuse_rollout_velocity,
            micro_batch=self.train_micro_batch,
            clip_range=self.clip_range,
            beta=self.beta,
            kl_form=self.kl_form,
        )

    def _backbone_spec(self) -> Any:
        """The registry entry of ``backbone``; ConfigError (one line, the allowed names) when it is unknown."""
        from jagg_engine.backbones import BACKBONES

        _one_of("backbone", self.backbone, tuple(BACKBONES))
        return BACKBONES[self.backbone]

    def _option_value(self, field_name: str, device: str) -> Any:
        """What a backbone option read from the config field ``field_name`` receives."""
        if field_name == "(the trainer)":
            return device
        if field_name == "beta":  # reference_copy: a frozen reference only when the KL term needs one
            return self.beta > 0
        if field_name == "precision":
            return "bfloat16" if self.precision == "bf16" else "float32"
        if field_name == "lora_targets":
            return list(self.lora_targets) or None
        if field_name not in _FIELD_NAMES:
            raise ConfigError(
                f"backbone: {self.backbone!r} reads the option from {field_name!r}, which is not a config field"
            )
        return getattr(self, field_name)

    def backbone_kwargs(self, device: str = "cpu") -> dict[str, Any]:
        """The keyword options of the backbone factory: ``backbone_options`` plus the options its registry entry
        reads from the config fields (``BackboneSpec.options``); a null model_path or empty lora_targets leaves
        the factory's default."""
        opts = dict(self.backbone_options)
        for option, field_name in self._backbone_spec().options.items():
            value = self._option_value(field_name, str(device))
            if value is None and field_name in ("model_path", "lora_targets"):
                continue  # the factory's default
            opts[option] = value
        return opts

    def _check_backbone_fields(self) -> None:
        """Refuse model fields the backbone would ignore and backbone_options it does not take."""
        from jagg_engine.backbones import BACKBONES

        mapped = self._backbone_spec().options
        defaults = TrainConfig()
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

    # ------------------------------------------------------------------ validation
    def validate(self, check_environment: bool = True) -> TrainConfig:
        """Raise ConfigError (one line) on the first bad field; return self.

        ``check_environment=False`` skips what depends on this machine: file existence and the reward
        registry's dependency/weight checks. Reward *names* are always checked. The ``plugins`` modules are
        imported first, so the SDE kinds, rewards and backbones they register are known by name. The checks run
        by section (run, model, reward, sampler, batches, update), each in its own method, in this order.
        """
        from jagg_engine.plugins import import_plugins

        _check_ranges(self)
        try:  # first: what the plugins register is then known by name below
            import_plugins(self.plugins)
        except ValueError as exc:
            raise ConfigError(_one_line(str(exc))) from None
        self._validate_run()
        self._validate_model()
        self._validate_reward()
        self._validate_sampler()
        self._validate_batches()
        self._validate_update()
        if check_environment:
            self._validate_environment()
        return self

    def _validate_run(self) -> None:
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

    def _validate_model(self) -> None:
        """backbone (a registered name), LoRA fields, precision, and the model fields this backbone reads."""
        self._backbone_spec()
        _bounded("lora_alpha", self.lora_alpha)
        if self.lora_targets and self.lora_rank == 0:
            raise ConfigError(
                "lora_targets: only used with LoRA; set lora_rank > 0 or leave lora_targets empty"
            )
        _one_of("precision", self.precision, PRECISIONS)
        self._check_backbone_fields()
        if self.lora_path is not None and self.lora_rank == 0:
            raise ConfigError("lora_path: a LoRA to start from needs LoRA; set lora_rank to its rank")
        if self.fsdp and self.processes == 1:
            raise ConfigError("fsdp: shards the model across processes; needs processes > 1, got processes 1")

    def _validate_reward(self) -> None:
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

    def _validate_sampler(self) -> None:
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

    def _validate_update(self) -> None:
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
        if self.jagg_until_step is not None and self.strategy != "jagg":
            raise ConfigError(
                f"jagg_until_step: switches from jagg to exact; needs strategy jagg, got strategy {self.strategy!r}"
                " (use jagg_until_step=null)"
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

    def _validate_environment(self) -> None:
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

    @property
    def rank_batch(self) -> int:
        """Samples per rank per step: prompts_per_step / processes × group_size (groups never straddle ranks)."""
        return self.prompts_per_step // self.processes * self.group_size

    def _validate_batches(self) -> None:
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


# ---------------------------------------------------------------------- loading


def load_config(path: str | None, overrides: list[str], check_environment: bool = True) -> TrainConfig:
    """Defaults ← YAML file (if any) ← ``key=value`` overrides, then validated."""
    cfg = TrainConfig()
    if path is not None:
        try:  # size, anchors/aliases, duplicate keys and depth first: nothing is parsed past the limits
            data = safe_yaml.load_file(path, "config file")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file: {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
            ) from None
        except OSError as exc:
            raise ConfigError(f"config file: cannot read {path}: {exc.strerror}") from None
        except safe_yaml.YamlRefused as exc:
            raise ConfigError(str(exc)) from None
        if data is None:
            raise ConfigError(f"config file: {path} is empty; it must be a mapping of field names to values")
        if not isinstance(data, dict):
            raise ConfigError(
                f"config file: {path} must be a mapping of field names to values, got {type(data).__name__}"
            )
        cfg = TrainConfig.from_dict(data)
    return cfg.apply_overrides(overrides).validate(check_environment=check_environment)


def check_runs_dir(path: str | os.PathLike[str], field_name: str = "output_dir") -> Path:
    """Make sure the runs root ``path`` can hold a history: create it if missing, write and delete a probe file.

    Refused with a one-line ConfigError naming ``field_name``: a NUL byte or a too-long name, a file in the
    way, a folder that cannot be created or written (read-only filesystem, no permission). Returns the path.
    Called once the config validated, just before the store is opened, so a refusal leaves nothing behind
    (a folder created by this call is removed again when the probe fails).
    """
    text = os.fspath(path)
    if not text or "\0" in text:
        raise ConfigError(f"{field_name}: must be a folder path without NUL bytes, got {_brief(text)}")
    if not text.isprintable():  # a newline or tab in a folder name breaks logs, tables and shell scripts
        raise ConfigError(
            f"{field_name}: must be a folder path of printable characters (no newline, tab or control"
            f" character), got {_brief(text)}"
        )
    folder = Path(text).expanduser()
    for part in folder.parts:
        if len(os.fsencode(part)) > 255:
            raise ConfigError(f"{field_name}: the name {part[:40]!r}… is longer than 255 bytes")
    if len(os.fsencode(str(folder.absolute()))) >= 4096:
        raise ConfigError(f"{field_name}: the path is longer than 4095 bytes")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{field_name}: {text} is a file, not a folder")
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{field_name}: cannot create {text}: {existing} is a file, not a folder")
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        if created:
            _remove_empty_chain(folder, existing)
        raise ConfigError(
            f"{field_name}: cannot write to {text}: {exc.strerror or _one_line(str(exc))}"
        ) from None
    return folder


def _remove_empty_chain(folder: Path, stop: Path) -> None:
    """Remove ``folder`` and its empty parents up to (not including) ``stop``; ignore what cannot go."""
    current = folder.absolute()
    while current != stop and current != current.parent:
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent


def read_prompts(path: str | os.PathLike[str], field_name: str = "prompts_file") -> list[str]:
    """Prompts from a .txt (one a line, blank lines skipped) or .jsonl file (objects with a "prompt" key)."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{field_name}: no such file: {path}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{field_name}: {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{field_name}: cannot read {path}: {_one_line(str(exc))}") from None
    prompts = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if p.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{field_name}: {path} line {lineno} is not JSON") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise ConfigError(f"{field_name}: {path} line {lineno} needs a string 'prompt' key")
            prompts.append(obj["prompt"])
        else:
            prompts.append(line.strip())
    if not prompts:
        raise ConfigError(f"{field_name}: {path} holds no prompts")
    return prompts


def model_path_kind(path: str) -> str:
    """ "local" (exists), "hub" (looks like a hub id ``owner/name``) or "missing" — see the module docstring."""
    if os.path.exists(os.path.expanduser(path)):  # False, not an error, for an impossible path
        return "local"
    looks_local = (
        path.startswith(("/", "./", "../", "~", "."))
        or path.endswith(_WEIGHT_SUFFIXES)
        or not _HUB_ID.match(path)
        or os.path.isdir(path.split("/")[0])
    )
    return "missing" if looks_local else "hub"


def field_table() -> list[dict[str, Any]]:
    """One row per field: name, type, default, help (for `jagg train --help` and the app's form)."""
    defaults = TrainConfig().to_dict()
    hints = _hints()
    return [
        {
            "name": f.name,
            "type": _type_name(hints[f.name]),
            "default": defaults[f.name],
            "help": f.metadata["help"],
        }
        for f in dataclasses.fields(TrainConfig)
    ]


# ---------------------------------------------------------------------- typed parsing

_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(TrainConfig))


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _check_known(key: str) -> None:
    if key not in _FIELD_NAMES:
        close = difflib.get_close_matches(key, _FIELD_NAMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "; run `jagg train --help` for the list"
        raise ConfigError(f"unknown field {_brief(key)}{hint}")


def _split_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if (typing.get_origin(tp) in (typing.Union, types.UnionType)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _type_name(tp: Any) -> str:
    base, optional = _split_optional(tp)
    name = getattr(base, "__name__", str(base)) if typing.get_origin(base) is None else str(base)
    return name + (" | None" if optional else "")


def _parse_text(key: str, tp: Any, text: str) -> Any:
    """An override's text → a Python value, before type coercion."""
    base, optional = _split_optional(tp)
    if optional and text.strip().lower() in ("null", "none", "~"):
        return None
    if base is str:
        return text
    if typing.get_origin(base) in (list, dict):
        try:
            return safe_yaml.load(text, key, max_bytes=safe_yaml.OVERRIDES_MAX_BYTES)
        except safe_yaml.YamlInvalid:
            raise ConfigError(f"{key}: {_expected(base)} written in YAML, got {_brief(text)}") from None
        except safe_yaml.YamlRefused as exc:
            raise ConfigError(_one_line(str(exc))) from None
    return text.strip()


def _expected(tp: Any) -> str:
    base, _ = _split_optional(tp)
    origin = typing.get_origin(base)
    if origin is list:
        return "must be a list"
    if origin is dict:
        return "must be a mapping"
    return f"must be {'an' if base is int else 'a'} {_type_name(base)}"


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Parse ``value`` (from YAML, JSON or an override) as ``tp``; raise a one-line ConfigError."""
    base, optional = _split_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: must not be null")
    where = f"{key}: {_expected(tp)}{' or null' if optional else ''}, got {_brief(value)}"
    origin = typing.get_origin(base)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(where)
        (item,) = typing.get_args(base)
        return [_coerce(f"{key}[{i}]", item, v) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(where)
        _, vtype = typing.get_args(base)
        return {str(k): _coerce(f"{key}.{k}", vtype, v) for k, v in value.items()}
    if base is Any:
        return value
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise ConfigError(f"{key}: must be true or false, got {_brief(value)}")
    if base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(where)
    if base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(where)
    if base is str:
        if isinstance(value, str):
            return value
        raise ConfigError(where)
    raise ConfigError(f"{key}: unsupported field type {tp}")  # a new field type needs a branch here


# ---------------------------------------------------------------------- range checks


def _one_line(text: str) -> str:
    return " ".join(text.split())


_brief = safe_yaml.brief


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


def _check_ranges(cfg: TrainConfig) -> None:
    """Types and ranges every field gets from its declaration: each value re-parsed as its type (a config
    built in code is held to the same types as one read from YAML), every integer (also inside lists and
    mappings) in [low, high] of the field's metadata (default 0..INT_MAX), every float finite."""
    hints = _hints()
    for f in dataclasses.fields(cfg):
        value = _coerce(f.name, hints[f.name], getattr(cfg, f.name))
        low, high = f.metadata.get("low", 0), f.metadata.get("high", INT_MAX)
        _check_value(f.name, hints[f.name], value, low, high)


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


def check_options(
    where: str, factory: Any, options: dict[str, Any], reserved: dict[str, str] | None = None
) -> None:
    """Check ``options`` against the keyword parameters of ``factory`` (a function or a class) before it is
    called: unknown names, options a config field sets (``reserved``: option → field) and values of the wrong
    type for the parameter's annotation raise a one-line ConfigError ``<where>.<option>: …``."""
    reserved = reserved or {}
    target = factory.__init__ if isinstance(factory, type) else factory
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check against
        return
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # an annotation that does not resolve here: check names only
        hints = {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = {n: p for n, p in sig.parameters.items() if p.kind in kinds}
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    allowed = sorted(n for n in params if n not in reserved)
    for key, value in options.items():
        if key in reserved:
            field_name = reserved[key]
            hint = "it is set by the trainer" if field_name.startswith("(") else f"set the field {field_name}"
            raise ConfigError(f"{where}.{key}: not allowed here; {hint}")
        if key not in params:
            if open_ended:
                continue
            raise ConfigError(f"{where}.{key}: unknown option; allowed: {', '.join(allowed) or '(none)'}")
        tp = hints.get(key)
        if tp is not None and not _matches(value, tp):
            raise ConfigError(f"{where}.{key}: must be {_describe(tp)}, got {_brief(value)}")
    for name, p in params.items():
        if p.default is inspect.Parameter.empty and name not in options and name not in reserved:
            raise ConfigError(f"{where}.{name}: required option is missing")


def _matches(value: Any, tp: Any) -> bool:
    """Whether a YAML value fits an annotation (bool is not an int; an int is a float; lists are sequences)."""
    if tp is Any or tp is object:
        return True
    if tp is type(None):
        return value is None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= INT_MAX
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str or tp is os.PathLike or tp is Path:
        return isinstance(value, str)
    if origin in (list, tuple, collections.abc.Sequence, collections.abc.Iterable):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args))
        return not args or all(_matches(v, args[0]) for v in value)
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True  # an annotation this checker does not know: the factory checks it


def _describe(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (list, tuple, collections.abc.Sequence, collections.abc.Iterable):
        return "a list"
    if origin in (dict, collections.abc.Mapping):
        return "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
    if tp in names:
        return names[tp]
    return f"a {getattr(tp, '__name__', str(tp))}"


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

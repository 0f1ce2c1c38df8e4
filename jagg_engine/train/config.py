"""The one typed config tree of a training run: a flat dataclass, YAML + ``key=value`` overrides, one validator.

Lifecycle::

    cfg = load_config("configs/tiny-shapes-cpu.yaml", ["steps=3", "window=4"])   # parsed + validated
    cfg.sampler_config(), cfg.update_config()                                      # engine objects
    store.create_run(cfg.name, cfg.to_dict(), run_dir)                             # persisted as JSON
    TrainConfig.from_dict(json.loads(run["config"]))                               # resume

Every field carries a help string (``field(metadata={"help": ...})``); :func:`field_table` lists them for
the CLI and the app. Values from YAML and from overrides go through the same typed parser
(:mod:`jagg_engine.train.config_parse`), so ``lr=1e-4`` on the command line and ``lr: 1e-4`` in YAML (which
PyYAML reads as a string) both become a float.

All checks run from :meth:`TrainConfig.validate`, one method a section (run, model, reward, sampler, batches,
update, environment) in :mod:`jagg_engine.train.config_validate`, and raise :class:`ConfigError` with a
one-line message that names the field and the allowed values (diffusers: "concise error messages are preferred
to silently correcting erroneous input"; TRL's ``_config_check``). ``validate(check_environment=False)`` runs
only the checks that depend on the config alone (types, ranges, cross-field constraints, known names);
the default also checks the machine: files exist and every reward's optional dependency and weights are
present (:func:`jagg_engine.rewards.registry.check_reward`, which loads no model).

``model_path``: ``None`` means the backbone's default; a local path or a string shaped like a Hugging Face hub
id is accepted (:func:`jagg_engine.train.config_files.model_path_kind`, whose module also reads the prompt
files and checks the runs root).

The names of those modules that callers use are importable from here as well.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

from jagg_engine import safe_yaml
from jagg_engine.sde_kinds import get_sde
from jagg_engine.train.config_files import PROMPT_SUFFIXES, check_runs_dir, model_path_kind, read_prompts
from jagg_engine.train.config_parse import (
    INT_MAX,
    ConfigError,
    _brief,
    _coerce,
    _one_line,
    _parse_text,
    _type_name,
    check_options,
)
from jagg_engine.train.config_validate import (
    ADV_STDS,
    ALGORITHMS,
    ENDPOINT_BACKWARDS,
    FLOAT_BOUNDS,
    GROUP_NOISES,
    MODEL_FIELDS,
    MOVING_WINDOWS,
    NAME_MAX,
    PRECISIONS,
    REWARD_WEIGHT_MAX,
    SCHEDULES,
    STRATEGIES,
    WINDOW_SCHEDULES,
    ConfigChecks,
    _one_of,
)

__all__ = [
    "ADV_STDS",
    "ALGORITHMS",
    "ENDPOINT_BACKWARDS",
    "FLOAT_BOUNDS",
    "GROUP_NOISES",
    "INT_MAX",
    "MODEL_FIELDS",
    "MOVING_WINDOWS",
    "NAME_MAX",
    "PRECISIONS",
    "PROMPT_SUFFIXES",
    "REWARD_WEIGHT_MAX",
    "SCHEDULES",
    "STRATEGIES",
    "WINDOW_SCHEDULES",
    "ConfigError",
    "TrainConfig",
    "check_options",
    "check_runs_dir",
    "field_table",
    "load_config",
    "model_path_kind",
    "read_prompts",
]


def _f(default: Any, help: str, *, low: int | None = None, high: int | None = None) -> Any:
    """A dataclass field with a help string; mutable defaults are copied per instance.

    ``low`` / ``high`` bound an integer field (or the integers inside a list field); without them every
    integer must lie in 0..INT_MAX (:meth:`jagg_engine.train.config_validate.ConfigChecks.check_ranges`), so a new field
    is range-checked with no code.
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
class TrainConfig(ConfigChecks):
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
    pair_cv: float = _f(
        1.0,
        "Strategy pair's control variate lambda in [0, 1]: each drawn step's upstream also carries lambda x (the"
        " other half's credits - the other drawn step's weighted credit), zero in expectation, so the gradient"
        " stays unbiased; at 1 the draw's noise cancels where the Jacobian is the same over the window. Reads every"
        " step's velocity (the rollout's with reuse: JAGG's cost). 0 = plain subsampling, no inner forward.",
    )
    pair_frac: float = _f(
        1.0,
        "Strategy pair: the share of each window's samples that draw a pair, in (0, 1]; the others, drawn"
        " uniformly, train JAGG's two endpoints with JAGG's credits, at the same cost. The expected gradient's"
        " bias is (1 - pair_frac) x JAGG's and the draw's noise falls with it. 1 = every sample (unbiased).",
    )
    alpha_scale: float = _f(
        1.0,
        "JAGG's weight of the inner steps at the far endpoint, as a fraction of the paper's alpha_j (strategy"
        " jagg): 1 = the paper's interpolation; 0 = every inner step credited to the near endpoint, whose state"
        " holds none of the window's injected noise. The same cost at every value.",
    )
    far_credit: str = _f(
        "own",
        "Strategy jagg: where the inner steps' far credits go. own (the paper): each sample's far endpoint, a"
        " state that holds the noise those credits are correlated with; cross (cross-fitting): the far endpoint"
        " of the next sample of the same group, drawn with other noise. The same cost; needs whole groups in"
        " each micro-batch, updates_per_rollout 1 and cv_frac 0.",
    )
    jagg_from_step: int | None = _f(
        None,
        "Strategy jagg: the exact backward of the same window up to and including this training step, then JAGG"
        " with the same optimizer state (the exact gradient while the policy moves most, JAGG's cheap steps"
        " after); null = jagg from the first step.",
        low=1,
    )
    jagg_until_step: int | None = _f(
        None,
        "Strategy jagg up to and including this training step, then the exact backward of the same window with"
        " the same optimizer state (JAGG's cheap early steps, the exact gradient once the signal is small);"
        " null = jagg throughout.",
        low=1,
    )
    switch_to: str = _f(
        "exact",
        "Strategy jagg with jagg_from_step or jagg_until_step: the backward of the steps outside JAGG's span."
        " exact (default): the per-step backward; pair: the unbiased estimator at JAGG's cost (strategy pair:"
        " one step drawn from each half of the window per sample), so the whole run costs what JAGG costs.",
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
        """Whether training step ``step`` trains by JAGG: strategy jagg, after any ``jagg_from_step`` and up to any
        ``jagg_until_step`` (``switch_to``, the exact backward by default, of the same window outside that span)."""
        after = self.jagg_from_step is None or step > self.jagg_from_step
        return (
            self.strategy == "jagg"
            and after
            and (self.jagg_until_step is None or step <= self.jagg_until_step)
        )

    def update_config(self, step: int | None = None) -> Any:
        """The update of training step ``step`` (None: the configured one): the exact backward where
        :meth:`jagg_at` says so."""
        from jagg_engine.jagg import UpdateConfig  # lazy: the engine module is owned elsewhere

        if step is not None and self.strategy == "jagg" and not self.jagg_at(step):
            return dataclasses.replace(
                self.update_config(),
                strategy=self.switch_to,
                cv_frac=0.0,
                far_credit="own",
                group_size=None,
                pair_cv=self.pair_cv if self.switch_to == "pair" else 0.0,
                pair_frac=self.pair_frac if self.switch_to == "pair" else 1.0,
            )
        return UpdateConfig(
            strategy=self.strategy,
            window=self.window,
            jagg_frac=self.jagg_frac,
            cv_frac=self.cv_frac,
            pair_cv=self.pair_cv if self.strategy == "pair" else 0.0,
            pair_frac=self.pair_frac if self.strategy == "pair" else 1.0,
            alpha_scale=self.alpha_scale,
            far_credit=self.far_credit,
            group_size=self.group_size if self.far_credit == "cross" else None,
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

    @property
    def rank_batch(self) -> int:
        """Samples per rank per step: prompts_per_step / processes × group_size (groups never straddle ranks)."""
        return self.prompts_per_step // self.processes * self.group_size

    # ------------------------------------------------------------------ validation
    def validate(self, check_environment: bool = True) -> TrainConfig:
        """Raise ConfigError (one line) on the first bad field; return self.

        ``check_environment=False`` skips what depends on this machine: file existence and the reward
        registry's dependency/weight checks. Reward *names* are always checked. The ``plugins`` modules are
        imported first, so the SDE kinds, rewards and backbones they register are known by name. The checks run
        by section (run, model, reward, sampler, batches, update), each a method this class inherits from
        :class:`jagg_engine.train.config_validate.ConfigChecks`, in this order.
        """
        from jagg_engine.plugins import import_plugins

        self.check_ranges()
        try:  # first: what the plugins register is then known by name below
            import_plugins(self.plugins)
        except ValueError as exc:
            raise ConfigError(_one_line(str(exc))) from None
        self.validate_run()
        self.validate_model()
        self.validate_reward()
        self.validate_sampler()
        self.validate_batches()
        self.validate_update()
        if check_environment:
            self.validate_environment()
        return self


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

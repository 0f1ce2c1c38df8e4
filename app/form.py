"""The New run form: its values → a validated :class:`TrainConfig`, a run's config → its values (Duplicate),
and the cost-model line shown under it. Pure functions, no gradio: the app's handlers and tests call them.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app import data
from app.runs import gpu_present
from app.space import check_space_config
from jagg_engine.safe_yaml import OVERRIDES_MAX_BYTES, brief
from jagg_engine.train.config import ConfigError, TrainConfig

# The New run form's inputs, in the order of form_config's parameters (the API's parameter names).
FORM_FIELDS = ("name", "backbone", "model_path", "rewards", "algorithm", "window", "jagg_frac", "cv_frac",
               "jagg_until_step", "strategy", "steps", "group_size", "lr", "seed", "processes", "overrides",
               "picks_timeout_s")  # fmt: skip
# The form's box for jagg_until_step shows 0 for "no switch" (a number box cannot stay empty), the config null.
NO_SWITCH = 0
# The picks reward's wait for votes (reward_options.picks.timeout_s) has a box of its own, last in the form so that
# a caller of the API that gives the fields before it keeps working. 0 in it is the option's null: no timeout, the
# run waits for every asked group's vote. The box writes the option only when it differs from the reward's default
# (PicksReward's timeout_s, restated here without torch), and the more-settings box wins over it.
PICKS_TIMEOUT_DEFAULT = 300.0
NO_TIMEOUT = 0


# The New run form's boxes whose label (app.layout.new_run_tab) starts with other words than the config key they
# set: a refusal of the form names the box (:func:`form_message`). Every other box is labelled by its key.
FORM_LABELS = {
    "model_path": "model path",
    "window": "W (window)",
    "jagg_until_step": "JAGG until step",
    "group_size": "group size",
    "overrides": "more settings",
    "picks_timeout_s": "picks: wait for votes (s)",
}


def form_name(key: str) -> str:
    """Config key ``key`` as the New run form names it: its box's label with the key in parentheses
    (``group size (group_size)``), the label alone where it shows the key (``W (window)``) or is the box of
    every other setting (``more settings``), the key itself where the box is labelled so (``steps``)."""
    label = FORM_LABELS.get(key)
    if label is None:
        return key
    return label if key in label or key == "overrides" else f"{label} ({key})"


# The config's null as a form's box says it (the box's label names it: "0 = throughout"): a refusal that offers
# "or null" offers this instead.
FORM_NULLS = {"jagg_until_step": f"{NO_SWITCH} (jagg throughout)"}


def form_message(message: Any) -> str:
    """A refusal of the New run form in the form's words: a leading config key named as the form names it
    (:func:`form_name`: ``group size (group_size): must be an integer >= 2, got 1``), a line about the text of
    the more-settings box (an unknown field, an override that is not ``name=value``) headed by that box's
    label; a box whose null the form shows as a number offers that number (:data:`FORM_NULLS`). A pair's
    ``the pair's exact run:`` stays in front; anything else is as it was."""
    text = str(message)
    pair = re.match(r"the pair's \w+ run: ", text)
    head = pair.group(0) if pair else ""
    text = text[len(head) :]
    if text.startswith(("unknown field ", "override ")):
        return f"{head}{FORM_LABELS['overrides']}: {text}"
    key, sep, rest = text.partition(": ")
    if sep and key in FORM_NULLS:
        rest = rest.replace(" or null", f", or {FORM_NULLS[key]}", 1)
    if sep and key in FORM_LABELS:
        return f"{head}{form_name(key)}: {rest}"
    return head + text


def has_gpu() -> bool:
    """An NVIDIA driver is present (decides the default r without initialising CUDA in the app)."""
    return gpu_present()


# ---------------------------------------------------------------------------------------------- form → config


def parse_rewards(text: str) -> dict[str, float]:
    """``"shapes-dense: 1.0, pickscore: 0.5"`` (commas or new lines; a bare name weighs 1) → dict."""
    rewards: dict[str, float] = {}
    for item in text.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, weight = item.partition(":")
        if not sep:
            name, sep, weight = item.partition("=")
        try:
            rewards[name.strip()] = float(weight) if sep else 1.0
        except ValueError:
            raise ConfigError(
                f"rewards: weight of {brief(name.strip())} must be a number, got {brief(weight.strip())}"
            ) from None
    return rewards


# The overrides box's example, valid as typed (a test checks it): 8 sampling steps hold the default window.
OVERRIDES_EXAMPLE = "sampling_steps=8\nprompts_per_step=4\neval_every=5"

RUN_ID_MAX = 2**63 - 1  # SQLite's INTEGER


def parse_run_id(value: Any, field: str = "run id") -> int | None:
    """A handler's run id (an int from a dropdown, a float from a number box, a string from a custom value or
    the API) → int, or None when empty. Anything else raises ConfigError naming ``field``: a fraction, NaN,
    a bool, a non-numeric string, a value outside 1..2^63 − 1."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    number: Any = value
    if isinstance(value, str):
        text = value.strip()
        number = int(text) if text.lstrip("+-").isdigit() and len(text) <= 20 else None
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= RUN_ID_MAX:
        raise ConfigError(f"{field}: must be a whole number from 1 to {RUN_ID_MAX}, got {brief(value)}")
    return number


def match_run(value: Any, runs: Sequence[Mapping[str, Any]], field: str = "run id") -> int | None:
    """The id a picker's value names, or None when empty: a run id (``12``, ``#12``, 12.0; whether that run
    exists is the caller's to say), a run's exact label (:func:`app.data.run_label`, or that label without
    its status) or the exact name of one run only, never a substring match: with runs #1–#11, "1" is run #1,
    never #11. Raises ConfigError in one line naming ``field`` (:func:`parse_run_id`'s) for a text that is
    none of these, or a name several runs share (naming them)."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        digits = text.removeprefix("#")
        if digits.isdigit():
            return parse_run_id(digits, field)
        for run in runs:
            label = data.run_label(run)
            if text in (label, label.rsplit(" (", 1)[0]):
                return int(run["id"])
        named = [int(run["id"]) for run in runs if str(run.get("name", "")).strip() == text]
        if len(named) == 1:  # a unique run name is that run
            return named[0]
        if named:
            ids = ", ".join(f"#{i}" for i in sorted(named))
            raise ConfigError(
                f"{field}: {len(named)} runs are named {brief(text)} ({ids}); pick one by its number"
            )
    return parse_run_id(value, field)  # a number, or the one-line error of a text that names no run


def pair_configs(cfg: TrainConfig) -> tuple[TrainConfig, TrainConfig]:
    """The exact and JAGG runs of a compare pair, both validated before either is queued: a setting only
    one strategy accepts (probe_every with exact) is refused in one line naming the run it breaks."""
    pair = []
    for strategy in ("exact", "jagg"):
        try:
            pair.append(TrainConfig.from_dict({**cfg.to_dict(), "strategy": strategy}).validate())
        except ConfigError as exc:
            raise ConfigError(f"the pair's {strategy} run: {exc}") from None
    return pair[0], pair[1]


def parse_ratio(value: Any, default: float) -> float:
    """The cost ratio r of the form (empty = ``default``); must be a finite number > 0."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    try:
        r = float(value)
    except (TypeError, ValueError):
        r = math.nan
    if isinstance(value, bool) or not (math.isfinite(r) and r > 0):
        raise ConfigError(f"r: must be a finite number > 0, got {brief(value)}")
    return r


def parse_overrides(text: str) -> list[str]:
    """One ``key=value`` a line (or separated by spaces when no value holds a space)."""
    items = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        items += line.split() if "=" in line and line.count("=") == len(line.split()) else [line]
    return items


def form_config(
    runs_dir: str | os.PathLike[str],
    name: str,
    backbone: str,
    model_path: str,
    rewards: str,
    algorithm: str,
    window: float,
    jagg_frac: float,
    cv_frac: float,
    jagg_until_step: float | None,
    strategy: str,
    steps: float,
    group_size: float,
    lr: float,
    seed: float,
    processes: float,
    overrides: str,
    picks_timeout_s: float | None = PICKS_TIMEOUT_DEFAULT,
    space_mode: bool = False,
) -> TrainConfig:
    """The form's values → a validated TrainConfig; raises ConfigError with the one-line message. With
    ``space_mode`` the result must also pass :func:`app.space.check_space_config` (caps, no paths)."""
    cfg = form_fields_config(
        name, backbone, model_path, rewards, algorithm, window, jagg_frac, cv_frac, jagg_until_step, strategy,
        steps, group_size, lr, seed, processes, overrides, picks_timeout_s,
    )  # fmt: skip
    if space_mode:  # every field, form or override, before the app sets its own output_dir
        check_space_config(cfg)
    cfg = TrainConfig.from_dict({**cfg.to_dict(), "output_dir": str(Path(runs_dir).resolve())})
    return cfg.validate(check_environment=True)


def form_fields_config(*form: Any) -> TrainConfig:
    """The form's values (in FORM_FIELDS order) → a TrainConfig, parsed but not validated."""
    values = dict(zip(FORM_FIELDS, form, strict=True))
    for key in ("name", "model_path", "rewards", "overrides"):
        text = values[key]
        if text is not None and not isinstance(text, str):
            raise ConfigError(f"{key}: must be text, got {brief(text)}")
        size = len((text or "").encode("utf-8", "surrogatepass"))
        if size > OVERRIDES_MAX_BYTES:  # before any parsing (the overrides box holds YAML)
            raise ConfigError(f"{key}: {size:,} bytes is over the limit of {OVERRIDES_MAX_BYTES:,} bytes")
    overrides = values.pop("overrides")
    picks_timeout = values.pop("picks_timeout_s")
    if (
        isinstance(picks_timeout, bool)
        or not isinstance(picks_timeout, (int, float))
        or not picks_timeout >= 0
    ):
        raise ConfigError(
            f"picks_timeout_s: must be a number of seconds >= 0 ({NO_TIMEOUT} = wait for every vote),"
            f" got {brief(picks_timeout)}"
        )
    values.update(
        name=(values["name"] or "").strip() or values["backbone"],
        model_path=(values["model_path"] or "").strip() or None,
        rewards=parse_rewards(values["rewards"] or ""),
        jagg_until_step=None if values["jagg_until_step"] in (None, NO_SWITCH) else values["jagg_until_step"],
    )
    for key, value in values.items():
        if value is None and key not in ("model_path", "jagg_until_step"):
            raise ConfigError(f"{key}: must not be empty")
    cfg = TrainConfig.from_dict(values).apply_overrides(parse_overrides(overrides))
    picks = cfg.reward_options.get("picks", {})
    if "picks" in cfg.rewards and "timeout_s" not in picks and picks_timeout != PICKS_TIMEOUT_DEFAULT:
        timeout = None if picks_timeout == NO_TIMEOUT else float(picks_timeout)
        options = {**cfg.reward_options, "picks": {**picks, "timeout_s": timeout}}
        cfg = TrainConfig.from_dict({**cfg.to_dict(), "reward_options": options})
    return cfg


# Fields the app sets itself, never carried from one run to another by Duplicate.
APP_FIELDS = ("output_dir",)


def config_form_values(config: Mapping[str, Any]) -> list[Any]:
    """A stored run config → the New run form's values (FORM_FIELDS order) that give that config back: the
    form's own fields, and every other field that differs from TrainConfig's default as one ``key=value`` line
    of the overrides box. Raises ConfigError if the config does not load or the values would not rebuild it."""
    cfg = TrainConfig.from_dict({k: v for k, v in config.items() if k not in APP_FIELDS})
    mine, default = cfg.to_dict(), TrainConfig().to_dict()
    shown = dict(mine)  # what the boxes show: the picks timeout moves to its box where the box can say it
    picks_timeout = PICKS_TIMEOUT_DEFAULT
    picks = dict(mine["reward_options"].get("picks", {}))
    timeout = picks.get("timeout_s", PICKS_TIMEOUT_DEFAULT)
    if "picks" in mine["rewards"] and (timeout is None or timeout > 0) and timeout != PICKS_TIMEOUT_DEFAULT:
        picks_timeout = NO_TIMEOUT if timeout is None else timeout
        del picks["timeout_s"]
        shown["reward_options"] = {k: v for k, v in mine["reward_options"].items() if k != "picks"}
        if picks:
            shown["reward_options"]["picks"] = picks
    extra = [
        f"{key}={override_text(value)}"
        for key, value in shown.items()
        if key not in FORM_FIELDS and key not in APP_FIELDS and value != default[key]
    ]
    values = [
        mine["name"],
        mine["backbone"],
        mine["model_path"] or "",
        ", ".join(f"{name}: {_number(weight)}" for name, weight in mine["rewards"].items()),
        *(
            NO_SWITCH if mine[key] is None and key == "jagg_until_step" else mine[key]
            for key in FORM_FIELDS[4:-2]
        ),
        "\n".join(extra),
        picks_timeout,
    ]
    rebuilt = form_fields_config(*values).to_dict()
    lost = [k for k in mine if k not in APP_FIELDS and rebuilt[k] != mine[k]]
    if lost:  # a value the form and overrides cannot write back (never expected: a field's type changed)
        raise ConfigError(f"{lost[0]}: {mine[lost[0]]!r} does not survive the New run form")
    return values


def override_text(value: Any) -> str:
    """A config value as the text of a ``key=value`` override that parses back to it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)  # YAML flow style; the typed parser coerces its numbers
    return str(value)


def _number(value: float) -> str:
    """The shortest text of a number that reads back as the same float."""
    text = f"{value:g}"
    return text if float(text) == value else repr(value)


# What the form's prediction is over: the exact run of "Compare exact vs JAGG" (the same config, strategy exact),
# in the words Live and Compare use (app.data.prediction_baseline).
FORM_BASELINE = "exact backward over the same trained steps"


def speedup_note(
    window: float | None,
    jagg_frac: float | None,
    strategy: str,
    r: float | None,
    reuse: bool = False,
    updates_per_rollout: int = 1,
    cv_frac: float | None = 0.0,
    jagg_until_step: float | None = None,
    steps: float | None = None,
    pair_credits: bool = True,
) -> str:
    """The cost-model line shown under the form before launch (``reuse``: reuse_rollout_velocity is auto):
    the speedup of a JAGG step (with the control variate's ``cv_frac``), and over the run's ``steps`` when it
    switches to the exact backward after ``jagg_until_step`` (0 or None: no switch). ``pair_credits``: strategy
    pair reads every step's credit (pair_cv > 0, the form's default), JAGG's cost."""
    try:
        w, f, r_, p = int(window), float(jagg_frac), float(r), float(cv_frac or 0.0)
        if (
            w != float(window) or w < 2 or not 0 <= f <= 1 or r_ <= 0 or not 0 <= p <= 1
        ):  # W = 2.5 is no window
            raise ValueError
    except (TypeError, ValueError):
        return (
            "Predicted update-phase speedup: needs W ≥ 2 (a whole number), jagg_frac and cv_frac in [0, 1]"
            " and r > 0."
        )
    kind = strategy if strategy in ("exact", "endpoint", "pair") else "jagg"
    credits = strategy == "pair" and pair_credits
    reuse = reuse and (
        strategy == "jagg" or credits
    )  # the kinds whose inner steps take the rollout's velocities
    p = p if strategy == "jagg" else 0.0
    s = data.predicted_speedup(
        w, r_, f, kind, reuse=reuse, updates_per_rollout=updates_per_rollout, cv_frac=p, pair_credits=credits
    )
    if strategy == "exact":
        return (
            f"Predicted update-phase speedup over {FORM_BASELINE}: **1.00×** (strategy exact is the baseline; "
            f"W·r = {w * r_:.1f} units per window)."
        )
    per_group_cv = ""
    if p > 0:  # the drawn fraction's inner steps by the exact backward too (in place of a replay's 1 unit)
        extra = p * (w - 2) * (r_ if reuse else r_ - 1)
        per_group_cv = f", plus the control variate's {extra:.1f} (cv_frac = {p:g})"
    if reuse:
        on = (
            "every update" if updates_per_rollout == 1 else f"the first of {updates_per_rollout} mini-batches"
        )
        per_group = f"{kind} with the rollout's velocities {2 * r_:.1f} on {on}, else {w - 2 + 2 * r_:.1f}"
    elif strategy == "endpoint" or (
        strategy == "pair" and not credits
    ):  # two steps with grad, no inner forward
        per_group = f"{strategy} {2 * r_:.1f}"
    else:
        per_group = f"{strategy} {w - 2 + 2 * r_:.1f}"
    if strategy == "pair":
        per_group += ", unbiased" + (", every step's credit read" if credits else "")
    line = (
        f"Predicted update-phase speedup over {FORM_BASELINE}: **{s:.2f}×** (cost model, W = {w}, jagg_frac = {f:g}, "
        f"r = {r_:g}: exact {w * r_:.1f} units per window, {per_group}{per_group_cv})."
    )
    try:
        until, n = int(jagg_until_step or 0), int(steps or 0)
    except (TypeError, ValueError):
        return line
    if strategy == "jagg" and 0 < until < n:
        whole = data.switched_speedup(s, n, until)
        line += f" JAGG for steps 1–{until}, exact after: **{whole:.2f}×** over the run's {n} steps."
    return line

"""The cost model of the update phase, and the grouping and routing of trained steps it counts. No torch.

Cost model (PAPER.md, "Cost model"): one transformer forward without grad costs 1 unit, a forward with grad
plus its backward costs r units. Per group of n trained steps:

    exact                       n·r
    jagg, jagg-sequential       (n − 2) + 2r      inner steps forwarded without grad, two endpoint backwards
    endpoint                    2r                the paper's ablation: the endpoints' own losses only
    pair                        2r                two steps drawn per sample, one from each half, weighted
    pair+cv                     (n − 2) + 2r      pair reading every step's credit (pair_cv > 0 or pair_frac < 1):
                                                  the undrawn steps forwarded without grad, one call a group
    pair+reuse+cv               2r                the same credits taken from the rollout (on-policy update)
    paper-code                  n + 2r            all n steps without grad, then each endpoint again with grad
    jagg+reuse                  2r                inner velocities taken from the rollout (on-policy update)

With the control variate (cv_frac = p, jagg only: :mod:`jagg_engine.jagg`), the drawn fraction p of the samples
also forwards and backwards its n − 2 inner steps with grad, and needs no no-grad forward of them:

    jagg, jagg-sequential       (1 − p)·(n − 2) + 2r + p·(n − 2)·r
    jagg+reuse, jagg+reuse+cv   2r + p·(n − 2)·r          (jagg+reuse+cv: `jagg bench`'s name for the shipped one)

A group of one step is exact under every strategy. Routing (jagg_frac = f) sends the first ceil(f·G) groups
(high noise first) to the strategy and the rest to exact: :func:`route_groups`, the plan the engine trains
with (:func:`jagg_engine.jagg.group_plan`), so the predicted speedup of the update phase is
Σ_groups n·r / Σ_groups cost(group). Without a step count the paper's continuous form
W·r / (f·c(W) + (1 − f)·W·r) is used.

Pure Python, so that the app (which shows predictions) and the engine (which routes) share one
implementation without the app importing torch.
"""

from __future__ import annotations

import math

# The strategies `jagg bench` times, and the engine's (jagg_engine.update_config.STRATEGIES), which routing knows.
BENCH_STRATEGIES = (
    "exact",
    "jagg",
    "jagg-sequential",
    "endpoint",
    "paper-code",
    "jagg+reuse",
    "jagg+reuse+cv",
    "pair",
    "pair+cv",
    "pair+reuse+cv",
)
ROUTED_STRATEGIES = ("exact", "jagg", "endpoint", "pair")
CV_STRATEGIES = (
    "jagg",
    "jagg-sequential",
    "jagg+reuse",
    "jagg+reuse+cv",
)  # the kinds a control variate (cv_frac) corrects


# ----------------------------------------------------------------------------------------------------------
# Grouping and routing


def check_routing(window: int, jagg_frac: float, strategy: str = "jagg") -> None:
    """W must be an integer ≥ 2 (≥ 1 for exact, whose one-step window is Flash-GRPO's) and f lie in [0, 1];
    raises ValueError naming the field."""
    low = 1 if strategy == "exact" else 2
    if isinstance(window, bool) or int(window) != window or window < low:
        why = "" if low == 1 else f" for strategy {strategy} (a one-step window trains with strategy=exact)"
        raise ValueError(f"window: must be an integer >= {low}{why}, got {window}")
    if not 0.0 <= jagg_frac <= 1.0:
        raise ValueError(f"jagg_frac: must be in [0, 1], got {jagg_frac}")


def make_groups(steps: list[int], window: int) -> list[list[int]]:
    """Cut the trained steps (denoising order) into consecutive groups of ``window``; the last may be shorter."""
    return [steps[i : i + window] for i in range(0, len(steps), window)]


def num_routed_groups(n_groups: int, jagg_frac: float) -> int:
    """ceil(jagg_frac · G), robust to float round-off (0.6 · 5 is 3.0000000000000004 in binary)."""
    return min(n_groups, math.ceil(round(jagg_frac * n_groups, 9)))


def route_groups(
    steps: list[int], strategy: str, window: int, jagg_frac: float
) -> list[tuple[list[int], str]]:
    """The groups of ``steps`` and the strategy each one uses after jagg_frac routing: the first
    ceil(f·G) groups of more than one step take ``strategy``, the others ``exact``."""
    if strategy not in ROUTED_STRATEGIES:
        raise ValueError(f"strategy: must be one of {', '.join(ROUTED_STRATEGIES)}, got {strategy!r}")
    groups = make_groups(steps, window)
    if strategy == "exact":
        return [(g, "exact") for g in groups]
    n = num_routed_groups(len(groups), jagg_frac)
    return [(g, strategy if k < n and len(g) > 1 else "exact") for k, g in enumerate(groups)]


# ----------------------------------------------------------------------------------------------------------
# Cost model


def check_cv_frac(cv_frac: float, kind: str) -> None:
    """cv_frac must lie in [0, 1] and be 0 unless ``kind`` is a JAGG kind; raises ValueError naming the field."""
    if not 0.0 <= cv_frac <= 1.0:
        raise ValueError(f"cv_frac: must be in [0, 1], got {cv_frac}")
    if cv_frac > 0 and kind not in CV_STRATEGIES:
        raise ValueError(f"cv_frac: only with strategy {' | '.join(CV_STRATEGIES)}, got {kind}")


def group_cost(n: int, r: float, kind: str, cv_frac: float = 0.0) -> float:
    """Units of one group of ``n`` trained steps computed as ``kind`` with the control variate's fraction
    ``cv_frac`` (module docstring tables)."""
    check_cv_frac(cv_frac, kind if n > 2 else "jagg")
    if n == 1 or kind == "exact":
        return n * r
    if kind in ("jagg", "jagg-sequential"):
        return (1 - cv_frac) * (n - 2) + 2 * r + cv_frac * (n - 2) * r
    if kind in ("jagg+reuse", "jagg+reuse+cv"):
        return 2 * r + cv_frac * (n - 2) * r
    if kind in ("endpoint", "pair", "pair+reuse+cv"):
        return 2 * r
    if kind == "pair+cv":
        return (n - 2) + 2 * r
    if kind == "paper-code":
        return n + 2 * r
    raise ValueError(f"strategy: must be one of {', '.join(BENCH_STRATEGIES)}, got {kind!r}")


def cost_model_speedup(
    window: int,
    r: float,
    jagg_frac: float,
    strategy: str = "jagg",
    trained_steps: int | None = None,
    reuse_fraction: float = 1.0,
    cv_frac: float = 0.0,
) -> float:
    """Predicted speedup of the update phase over exact: Σ n·r / Σ cost(group) (PAPER.md, "Cost model").

    With ``trained_steps`` K the groups and their routing are the engine's (:func:`route_groups` of K steps:
    trailing short group, ceil(f·G)); without it, the paper's continuous form
    W·r / (f·c(W) + (1 − f)·W·r) with c(W) the strategy's per-group cost.
    ``reuse_fraction`` (jagg+reuse and pair+reuse+cv only): the fraction ρ of the update's samples whose policy
    is still the sampling one — 1 / updates_per_rollout, since only the first mini-batch reuses — so a routed
    group costs ρ·2r + (1 − ρ)·((n − 2) + 2r). ``cv_frac`` p: the control variate's drawn fraction (jagg kinds only),
    costed as in the module docstring.
    Example: W = 4, r = 1.8, f = 1, jagg → 7.2 / 5.6; jagg+reuse → 7.2 / 3.6, with ρ = 1/2 → 7.2 / 4.6.
    """
    if strategy not in BENCH_STRATEGIES:
        raise ValueError(f"strategy: must be one of {', '.join(BENCH_STRATEGIES)}, got {strategy!r}")
    if not r > 0:
        raise ValueError(f"r: must be > 0, got {r}")
    if not 0 <= reuse_fraction <= 1:
        raise ValueError(f"reuse_fraction: must be in [0, 1], got {reuse_fraction}")
    check_routing(window, jagg_frac, strategy)
    check_cv_frac(cv_frac, strategy)

    def cost(n: int, kind: str) -> float:
        p = cv_frac if kind in CV_STRATEGIES else 0.0
        if kind in ("jagg+reuse", "jagg+reuse+cv", "pair+reuse+cv"):
            unreused = "pair+cv" if kind.startswith("pair") else "jagg"
            return reuse_fraction * group_cost(n, r, kind, p) + (1 - reuse_fraction) * group_cost(
                n, r, unreused, p
            )
        return group_cost(n, r, kind, p)

    if strategy == "exact":
        return 1.0
    if trained_steps is None:
        exact = window * r
        return exact / (jagg_frac * cost(window, strategy) + (1 - jagg_frac) * exact)
    if trained_steps < 1:
        raise ValueError(f"trained_steps: must be a positive integer, got {trained_steps}")
    routed = (
        "pair" if strategy.startswith("pair") else "endpoint" if strategy == "endpoint" else "jagg"
    )  # the engine strategy each bench one routes as
    plan = route_groups(list(range(trained_steps)), routed, window, jagg_frac)
    exact = sum(len(g) * r for g, _ in plan)
    return exact / sum(cost(len(g), strategy if kind != "exact" else "exact") for g, kind in plan)


def switched_speedup(
    step_speedup: float,
    steps: int,
    jagg_until_step: int | None,
    jagg_from_step: int | None = None,
    other_speedup: float = 1.0,
) -> float:
    """The update-phase speedup over a whole run of ``steps`` training steps (numbered from 1) that trains by
    JAGG on the steps after ``jagg_from_step`` and up to ``jagg_until_step`` (a step's speedup
    ``step_speedup``) and by ``switch_to`` on the others (a step's speedup ``other_speedup``: 1 for the exact
    backward): steps / (S / s + (steps − S) / o), S the JAGG steps; ``step_speedup`` itself when every step is
    a JAGG one."""
    last = steps if jagg_until_step is None else min(max(int(jagg_until_step), 0), steps)
    S = max(last - (0 if jagg_from_step is None else max(int(jagg_from_step), 0)), 0)
    if S >= steps:
        return float(step_speedup)
    return steps / (S / step_speedup + (steps - S) / other_speedup)


def predicted_speedup(
    window: int,
    r: float,
    jagg_frac: float,
    strategy: str = "jagg",
    trained_steps: int | None = None,
    reuse: bool = False,
    updates_per_rollout: int = 1,
    cv_frac: float = 0.0,
    pair_credits: bool = False,
) -> float:
    """The prediction for a training run's settings: :func:`cost_model_speedup` of its engine ``strategy``
    (exact | jagg | endpoint | pair). With velocity reuse (``reuse``, strategy jagg) a JAGG group costs 2r on
    the first of the ``updates_per_rollout`` mini-batches (the only one still on the sampling policy) and
    (W − 2) + 2r on the others; the control variate (``cv_frac``) adds its drawn samples' inner steps. Strategy
    pair with ``pair_credits`` (pair_cv > 0 or pair_frac < 1) reads every step's credit: the same costs as
    JAGG's, reuse included. The app and `jagg bench` print the same number."""
    reuse_fraction = 1 / max(int(updates_per_rollout), 1)
    if reuse and strategy == "jagg":
        return float(
            cost_model_speedup(window, r, jagg_frac, "jagg+reuse", trained_steps, reuse_fraction, cv_frac)
        )
    if strategy == "pair" and pair_credits:
        kind = "pair+reuse+cv" if reuse else "pair+cv"
        return float(cost_model_speedup(window, r, jagg_frac, kind, trained_steps, reuse_fraction))
    return float(
        cost_model_speedup(
            window, r, jagg_frac, strategy=strategy, trained_steps=trained_steps, cv_frac=cv_frac
        )
    )

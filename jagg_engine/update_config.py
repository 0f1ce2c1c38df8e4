"""How the policy gradient of one rollout batch is computed: :class:`UpdateConfig`, the settings
:func:`jagg_engine.jagg.policy_update` reads (the strategies themselves are described in :mod:`jagg_engine.jagg`,
their credit arithmetic in :mod:`jagg_engine.credit`), and the names each setting allows."""

from __future__ import annotations

from dataclasses import dataclass

from .cost import ROUTED_STRATEGIES, check_routing
from .grpo import KL_FORMS

STRATEGIES = ROUTED_STRATEGIES  # exact | jagg | endpoint | pair, the strategies the cost model routes
ENDPOINT_BACKWARDS = ("joint", "sequential")
REUSE_MODES = ("off", "auto")
FAR_CREDITS = ("own", "cross")


@dataclass(frozen=True)
class UpdateConfig:
    """How the policy gradient of one rollout batch is computed.

    strategy:          exact | jagg | endpoint (see the module docstring)
    window:            W ≥ 2 (≥ 1 for exact), trained steps per group
    jagg_frac:         fraction of the groups (high noise first) that use the strategy; the rest are exact
    endpoint_backward: joint (one backward over both endpoints) | sequential (half the activation memory)
    clip_range:        PPO clip range ε
    beta:              weight of the KL to the reference policy (0 = no reference forwards)
    kl_form:           flow-grpo | gaussian — the KL term's form (:func:`jagg_engine.grpo.step_kl`); flow-grpo
                       (default) is Flow-GRPO's, so its β carries over
    micro_batch:       samples per model call in the update (None = the whole batch); the gradient is the
                       whole batch's, accumulated over micro-batches
    alpha_scale:       c ∈ [0, 1], the inner steps' share at the far endpoint: α_j ← c·α_j (:func:`jagg_alpha`);
                       1 = the paper's interpolation, 0 = every inner step credited to the near endpoint J_0,
                       whose state comes before any of the window's injected noise (module docstring, "Where
                       the far endpoint's weight goes"); the same cost at every c
    cv_frac:           control variate (strategy jagg): the fraction p of the samples of each JAGG group whose
                       exact − JAGG correction is added, weighted B / m (module docstring); 0 = plain JAGG,
                       1 = the exact gradient; the draw comes from ``policy_update``'s ``generator``
    far_credit:        own | cross (strategy jagg): where the inner steps' far credits α_j·s_ij go. own (the
                       paper): sample i's far endpoint J(z^i_{W−1}), a state that holds the noise ε_ij those credits
                       are correlated with. cross (cross-fitting): the far endpoint of the NEXT sample of i's group
                       of ``group_size`` (:func:`group_shift`), a state drawn with other noise, so the pairing of
                       ε_ij with a Jacobian that depends on it is gone; the endpoints' own credits stay their own.
                       The same cost; equal to own where the group's samples share their states (and so exact
                       under Theorem 1's condition). Needs whole groups in each micro-batch, no control variate.
    group_size:        samples per group, consecutive in the batch (far_credit cross)
    pair_cv:           λ ∈ [0, 1], strategy pair's control variate (:mod:`jagg_engine.credit`, "Strategy pair"):
                       each drawn step's upstream also carries λ·(the other half's credits − the other drawn
                       step's weighted credit), zero in expectation over the other draw, so the gradient stays
                       unbiased; at λ = 1 the draw's noise cancels where J is the same over the window. Needs every
                       step's credit s_j: the rollout's velocities (reuse) or no-grad forwards of the samples that
                       did not draw a step, JAGG's cost. 0 = plain subsampling, no inner forward.
    pair_frac:         f ∈ (0, 1], strategy pair: the share ceil(f·B)/B of each window's samples that draw a pair;
                       the others, drawn uniformly, train JAGG's endpoints with JAGG's credits
                       (:func:`jagg_engine.credit.pair_mix`), the same cost. The expected gradient's bias is
                       (1 − ceil(f·B)/B) times JAGG's; the draw's variance falls with f. Like ``pair_cv`` > 0 it
                       reads every step's credit. 1 = every sample draws a pair (unbiased).
    reuse_rollout_velocity: auto | off. With auto, the inner steps of a JAGG group take v̂_j stored by the
                       rollout instead of a no-grad forward, when and only when (1) the caller says the
                       policy has not been written since the rollout (``policy_update``'s ``rollout_policy``;
                       the trainer: first mini-batch, no optimizer step or checkpoint load since sampling) and
                       (2) the guard agrees (:func:`can_reuse_velocities`: same model object, every parameter
                       and buffer at its in-place version and holding the same bits, the same modes,
                       adapter states and scalar settings, no dropout active, velocities stored in the compute
                       dtype) — a group then costs 2r instead of W − 2 + 2r.
    """

    strategy: str = "jagg"
    window: int = 4
    jagg_frac: float = 1.0
    endpoint_backward: str = "joint"
    clip_range: float = 1e-3
    beta: float = 0.0
    reuse_rollout_velocity: str = "off"
    kl_form: str = "flow-grpo"
    micro_batch: int | None = None
    cv_frac: float = 0.0
    alpha_scale: float = 1.0
    far_credit: str = "own"
    group_size: int | None = None
    pair_cv: float = 0.0
    pair_frac: float = 1.0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy: must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        check_routing(self.window, self.jagg_frac, self.strategy)
        if self.endpoint_backward not in ENDPOINT_BACKWARDS:
            raise ValueError(
                f"endpoint_backward: must be one of {', '.join(ENDPOINT_BACKWARDS)}, got {self.endpoint_backward!r}"
            )
        if not self.clip_range > 0:
            raise ValueError(f"clip_range: must be > 0, got {self.clip_range}")
        if self.beta < 0:
            raise ValueError(f"beta: must be >= 0, got {self.beta}")
        if self.kl_form not in KL_FORMS:
            raise ValueError(f"kl_form: must be one of {', '.join(KL_FORMS)}, got {self.kl_form!r}")
        if self.reuse_rollout_velocity not in REUSE_MODES:
            raise ValueError(
                f"reuse_rollout_velocity: must be one of {', '.join(REUSE_MODES)}, got {self.reuse_rollout_velocity!r}"
            )
        if self.micro_batch is not None and (
            isinstance(self.micro_batch, bool)
            or int(self.micro_batch) != self.micro_batch
            or self.micro_batch < 1
        ):
            raise ValueError(f"micro_batch: must be an integer >= 1 or None, got {self.micro_batch}")
        if not 0.0 <= self.cv_frac <= 1.0:
            raise ValueError(f"cv_frac: must be in [0, 1], got {self.cv_frac}")
        if not 0.0 <= self.alpha_scale <= 1.0:
            raise ValueError(f"alpha_scale: must be in [0, 1], got {self.alpha_scale}")
        if self.cv_frac > 0 and self.strategy != "jagg":
            raise ValueError(
                f"cv_frac: only with strategy jagg (got strategy {self.strategy}); use cv_frac=0"
            )
        if not 0.0 <= self.pair_cv <= 1.0:
            raise ValueError(f"pair_cv: must be in [0, 1], got {self.pair_cv}")
        if self.pair_cv > 0 and self.strategy != "pair":
            raise ValueError(
                f"pair_cv: only with strategy pair (got strategy {self.strategy}); use pair_cv=0"
            )
        if not 0.0 < self.pair_frac <= 1.0:
            raise ValueError(f"pair_frac: must be in (0, 1], got {self.pair_frac}")
        if self.pair_frac < 1 and self.strategy != "pair":
            raise ValueError(
                f"pair_frac: only with strategy pair (got strategy {self.strategy}); use pair_frac=1"
            )
        if self.far_credit not in FAR_CREDITS:
            raise ValueError(f"far_credit: must be one of {', '.join(FAR_CREDITS)}, got {self.far_credit!r}")
        if self.far_credit == "cross":
            G = self.group_size
            if isinstance(G, bool) or not isinstance(G, int) or G < 2:
                raise ValueError(f"far_credit: cross needs group_size >= 2 (samples of one prompt), got {G}")
            if self.strategy != "jagg" or self.cv_frac > 0:
                raise ValueError(
                    f"far_credit: cross is a JAGG estimator without control variate, got strategy"
                    f" {self.strategy} and cv_frac {self.cv_frac} (use far_credit=own)"
                )
            if self.micro_batch is not None and self.micro_batch % G:
                raise ValueError(
                    f"far_credit: cross needs whole groups in each micro-batch, a multiple of group_size {G};"
                    f" got micro_batch {self.micro_batch}"
                )

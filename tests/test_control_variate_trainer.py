"""The control variate through the real Trainer, in the combinations users make: at cv_frac = 1 a JAGG run's
gradient is the exact run's (window schedules, noise, SDE kinds, micro- and mini-batches, reuse); its draws
come from their own stream (the same after a resume, another on each rank and step); two processes train with it.
"""

from __future__ import annotations

import pytest
import torch

from jagg_engine.store import open_store
from jagg_engine.train.config import load_config
from jagg_engine.train.trainer import Trainer, step_generator

SMALL_FLUX = [
    "backbone=tiny-flux",
    "rewards={brightness: 1.0}",
    "prompts_per_step=2",
    "group_size=3",
    "sampling_steps=6",
    "sde_window_end=4",
    "window=4",
    "eval_every=0",
    "sample_every=0",
    "checkpoint_every=0",
    "lr=1e-3",
    "clip_range=0.05",
]


def make_trainer(tmp_path, name, *overrides) -> Trainer:
    cfg = load_config(None, [*SMALL_FLUX, *overrides], check_environment=False)
    store = open_store(tmp_path)
    run_id = store.create_run(name, cfg.to_dict(), tmp_path / name)
    return Trainer(cfg, run_id, str(tmp_path))


def gradients_of_steps(trainer: Trainer, steps: list[int]) -> list[list[torch.Tensor]]:
    """The gradient each optimizer step of ``steps`` applies (before clipping), every mini-batch's."""
    seen = []
    optimize = trainer.optimize

    def record(step: int) -> float:
        seen.append(torch.cat([p.grad.detach().flatten().clone() for p in trainer.params]))
        return optimize(step)

    trainer.optimize = record
    for step in steps:
        trainer.train_step(step)
    return seen


# The combinations users make, as overrides of SMALL_FLUX: the control variate's, alpha_scale's, the cross-fitted
# credit's and jagg_from_step's trainer tests run through them.
COMBOS = {
    "fixed-reuse": [],
    "micro-mini-batches": ["train_micro_batch=4", "updates_per_rollout=2"],
    "sliding-shared-noise": ["sde_window_schedule=sliding", "sde_window_end=5", "window_shift_every=1",
                             "group_noise=shared"],
    "dance-no-reuse": ["algorithm=dance", "reuse_rollout_velocity=off"],
    "cps-two-windows": ["algorithm=cps", "sampling_steps=9", "sde_window_end=8"],
}  # fmt: skip


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def resumed_after(trainer: Trainer, tmp_path, name: str, *overrides: str) -> Trainer:
    """A fresh trainer of ``overrides`` given ``trainer``'s weights and optimizer state, as a resume loads them."""
    import copy

    fresh = make_trainer(tmp_path, name, *overrides)
    fresh.model.load_state_dict(copy.deepcopy(trainer.model.state_dict()))
    fresh.optimizer.load_state_dict(copy.deepcopy(trainer.optimizer.state_dict()))
    fresh.policy_writes += 1  # as load_checkpoint: the weights were written
    return fresh


@pytest.mark.parametrize("combo", list(COMBOS.values()), ids=list(COMBOS))
def test_cv_frac_one_trains_with_the_exact_gradient(tmp_path, combo):
    exact = make_trainer(tmp_path, "exact", "strategy=exact", *combo)
    cv = make_trainer(tmp_path, "cv", "strategy=jagg", "cv_frac=1.0", *combo)
    jagg = make_trainer(tmp_path, "jagg", "strategy=jagg", *combo)
    g_exact, g_cv, g_jagg = (gradients_of_steps(t, [1, 2]) for t in (exact, cv, jagg))
    assert len(g_exact) == len(g_cv) >= 2
    for a, b, c in zip(g_cv, g_exact, g_jagg):
        assert float((a - b).norm() / b.norm()) <= 1e-5  # float32
        assert float((c - b).norm() / b.norm()) > 1e-3  # while JAGG alone is not the exact gradient here


def test_draws_come_from_their_own_stream_of_seed_step_and_rank(tmp_path):
    """A step's draws are a function of (seed, step, rank): replayed on a resume, other ones at another step,
    rank or seed — and drawing them moves no other stream (the trainer's rollouts are unchanged)."""
    a = step_generator(load_config(None, SMALL_FLUX, check_environment=False), 3, 0, "control_variate")
    b = step_generator(load_config(None, SMALL_FLUX, check_environment=False), 3, 0, "control_variate")
    draws = lambda g: torch.randperm(64, generator=g)  # noqa: E731
    assert torch.equal(draws(a), draws(b))
    cfg = load_config(None, SMALL_FLUX, check_environment=False)
    others = [step_generator(cfg, 4, 0, "control_variate"), step_generator(cfg, 3, 1, "control_variate")]
    others.append(step_generator(load_config(None, [*SMALL_FLUX, "seed=1"]), 3, 0, "control_variate"))
    ref = draws(step_generator(cfg, 3, 0, "control_variate"))
    assert all(not torch.equal(draws(g), ref) for g in others)
    # the same run with and without the control variate samples the same rollouts
    plain, corrected = make_trainer(tmp_path, "plain"), make_trainer(tmp_path, "cv", "cv_frac=0.5")
    for t in (plain, corrected):
        t.train_step(1)
    prompts, _ = plain.step_prompts(2)
    assert torch.equal(plain.sample(2, prompts).latents[0], corrected.sample(2, prompts).latents[0])


def test_a_run_with_a_control_variate_replays_its_steps_after_a_resume(tmp_path):
    """Steps 1–2 in one trainer, and step 2 in a fresh trainer given the weights and optimizer state after step
    1 (what a resume loads): the same weights — the draws depend on (seed, step, rank) only."""
    whole = make_trainer(tmp_path, "whole", "cv_frac=0.5")
    m1 = whole.train_step(1)
    resumed = resumed_after(whole, tmp_path, "resumed", "cv_frac=0.5")
    whole.train_step(2)
    resumed.train_step(2)
    for p, q in zip(whole.params, resumed.params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    # 2 prompts × 3 samples = 6; m = ceil(0.5 · 6) = 3 samples drawn at each of the 2 inner steps
    assert m1["count/cv_pairs"] == 6.0


def test_two_processes_train_with_a_control_variate(tmp_path):
    """`jagg train --processes 2`: each rank draws from its own stream over its own samples."""
    from toy import jagg

    proc = jagg(
        "train", *SMALL_FLUX, "cv_frac=0.5", "steps=2", "--processes", "2", "--runs-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = open_store(tmp_path)
    (run,) = store.list_runs()
    assert run["status"] == "finished"
    frame = store.metrics_frame(run["id"])
    # rank 0: 1 prompt × 3 samples; m = ceil(0.5 · 3) = 2 at each of the 2 inner steps
    assert frame.loc[frame.step > 0, "count/cv_pairs"].tolist() == [4.0, 4.0]


def test_jagg_until_step_switches_to_the_exact_backward_keeping_the_optimizer(tmp_path):
    """jagg_until_step = 1: step 1 is one JAGG backward per window, step 2 the window's exact backward; the
    optimizer's state carries over (Adam's step count reaches 2), and route/jagg marks the switch."""
    trainer = make_trainer(tmp_path, "switch", "jagg_until_step=1", "steps=2")
    m1 = trainer.train_step(1)
    m2 = trainer.train_step(2)
    assert (m1["route/jagg"], m2["route/jagg"]) == (1.0, 0.0)
    assert m1["count/backward"] == 1 and m1["count/reused"] == 2  # one joint backward, inner steps reused
    assert m2["count/backward"] == 4 and m2["count/reused"] == 0  # the 4 trained steps one by one
    state = trainer.optimizer.state_dict()["state"]
    assert all(float(s["step"]) == 2 for s in state.values())
    # the exact step is the exact routine's: the same gradient as an exact run's update on that rollout
    exact = make_trainer(tmp_path, "exact", "strategy=exact")
    exact.model.load_state_dict(trainer.model.state_dict())
    g_switch, g_exact = gradients_of_steps(trainer, [3]), gradients_of_steps(exact, [3])
    assert float((g_switch[0] - g_exact[0]).norm() / g_exact[0].norm()) <= 1e-6


def test_jagg_from_step_trains_by_the_exact_backward_first_then_by_jagg(tmp_path):
    """jagg_from_step = 1: step 1 is the window's exact backward (the same gradient as an exact run's, to 1e-6),
    step 2 one JAGG backward per window with the cv_frac of the config, on the same optimizer."""
    trainer = make_trainer(tmp_path, "from", "jagg_from_step=1", "steps=3", "cv_frac=0.5")
    exact = make_trainer(tmp_path, "exact", "strategy=exact", "steps=3")
    g_from, g_exact = gradients_of_steps(trainer, [1]), gradients_of_steps(exact, [1])
    assert float((g_from[0] - g_exact[0]).norm() / g_exact[0].norm()) <= 1e-6
    assert trainer.update.strategy == "exact" and trainer.update.cv_frac == 0.0
    m2 = trainer.train_step(2)
    assert m2["route/jagg"] == 1.0 and trainer.update.cv_frac == 0.5
    # one joint backward per window; the control variate's pairs: ceil(0.5 · 6 samples) at each of 2 inner steps
    assert (m2["count/backward"], m2["count/cv_pairs"]) == (1.0, 6.0)
    state = trainer.optimizer.state_dict()["state"]
    assert all(float(s["step"]) == 2 for s in state.values())


@pytest.mark.parametrize("combo", list(COMBOS.values()), ids=list(COMBOS))
def test_jagg_from_step_is_the_exact_run_then_the_jagg_run_and_resumes_bit_for_bit(tmp_path, combo):
    """jagg_from_step = 1 through each combination: step 1 applies the exact run's gradient (1e-6); step 2,
    from the same weights and optimizer state, the JAGG run's; a trainer resumed after step 1 ends step 2 on
    the same weights, bit for bit."""
    switch = make_trainer(tmp_path, "from", "jagg_from_step=1", *combo)
    exact = make_trainer(tmp_path, "exact", "strategy=exact", *combo)
    g_switch, g_exact = gradients_of_steps(switch, [1]), gradients_of_steps(exact, [1])
    assert len(g_switch) == len(g_exact) >= 1
    assert all(rel(a, b) <= 1e-6 for a, b in zip(g_switch, g_exact))
    jagg = resumed_after(switch, tmp_path, "jagg", *combo)
    resumed = resumed_after(switch, tmp_path, "resumed", "jagg_from_step=1", *combo)
    exact_2 = resumed_after(switch, tmp_path, "exact-2", "strategy=exact", *combo)
    g_switch, g_jagg, g_exact = (gradients_of_steps(t, [2]) for t in (switch, jagg, exact_2))
    assert all(rel(a, b) <= 1e-6 for a, b in zip(g_switch, g_jagg))
    assert all(rel(a, b) > 1e-3 for a, b in zip(g_switch, g_exact))  # step 2 is JAGG's, not exact's
    resumed.train_step(2)
    for p, q in zip(switch.params, resumed.params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_a_jagg_span_between_from_and_until_is_what_the_run_trains(tmp_path):
    """jagg_from_step = 1 and jagg_until_step = 2: exact, JAGG, exact; the cost model counts the one JAGG step."""
    from jagg_engine.cost import switched_speedup

    trainer = make_trainer(tmp_path, "span", "jagg_from_step=1", "jagg_until_step=2", "steps=3")
    routes = [trainer.train_step(step)["route/jagg"] for step in (1, 2, 3)]
    assert routes == [0.0, 1.0, 0.0]
    assert switched_speedup(2.0, 3, 2, 1) == pytest.approx(3 / (0.5 + 2))
    assert switched_speedup(2.0, 70, None, 20) == pytest.approx(70 / (25 + 20))
    assert switched_speedup(2.0, 70, None, None) == switched_speedup(2.0, 70, 80, None) == 2.0


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["strategy=exact", "jagg_from_step=5"],
            "jagg_from_step: switches from exact to jagg; needs strategy jagg",
        ),
        (["jagg_from_step=0"], "jagg_from_step: must be"),
        (["jagg_from_step=5", "jagg_until_step=5"], r"jagg_from_step: must be below jagg_until_step \(5\)"),
        (
            ["strategy=exact", "jagg_until_step=5"],
            "jagg_until_step: switches from jagg to exact; needs strategy jagg",
        ),
        (["jagg_until_step=0"], "jagg_until_step: must be"),
    ],
)
def test_switch_refusals_name_the_field(overrides, line):
    from jagg_engine.train.config import ConfigError

    with pytest.raises(ConfigError, match=f"^{line}"):
        load_config(None, [*SMALL_FLUX, *overrides], check_environment=False)

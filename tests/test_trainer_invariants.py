"""Invariants of the composed Trainer, over the combinations users make (one real training step each).

Each combination of strategy × SDE window schedule × group_noise × ode_solver on tiny-shapes (shifted-linear σ,
the mini-/micro-batch setting alternating), and each strategy × mini-/micro-batches under ``schedule: pipeline``
on a tiny FLUX (FLUX.1's dynamic shift) and a tiny SD3, builds a Trainer, runs its step-0 eval, one
``train_step`` and the eval after it, and checks:

- the rollout walks the configured σ grid (the schedule's own σ inside the SDE window, its first and last σ,
  the configured count of ODE steps on either side) and the eval walks the schedule's σ, at every eval;
- the SDE noise, recovered from the stored latents as (z_{j+1} − μ_j)/std_j, is independent of z_0 and across
  SDE steps and training steps (|correlation| below 6/√n), and the recomputed log-probs equal the rollout's;
- on the first mini-batch the update's PPO ratio is 1 to 1e-6 and nothing is clipped;
- the model calls counted in sampling and in the update equal what the window and the routing plan say;
- the logged ``sampler/window_*`` and ``sampler/sigma_window_*`` equal the schedule.

A distribution test on ``gauss-toy`` (Gaussian data, its flow velocity in closed form) checks the rollout's
latents at every grid step against the mean and std the sampler's own affine steps give from N(0, I) noise
with independent SDE noise (sde, dance, cps), and, for the marginal-preserving SDEs, against the data's
marginal N((1 − σ)·m, c(σ)²).

Two processes: tests/dist/invariants.py runs four combinations under `accelerate launch` and checks the same
on every rank, plus noise independence across the ranks.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_backbones_diffusers import save_tiny_flux, save_tiny_sd3  # noqa: I001

from jagg_engine.cost import route_groups
from jagg_engine.sde import make_sigmas, ode_step
from jagg_engine.store import open_store
from jagg_engine.train.config import load_config
from jagg_engine.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    "prompts_per_step=2",
    "group_size=2",
    "sampling_steps=6",
    "sde_window_start=1",
    "sde_window_end=4",
    "window=2",
    "ode_steps_after=1",
    "eval_num_prompts=2",
    "eval_seeds=[0]",
    "eval_every=1",
    "sample_every=0",
    "checkpoint_every=0",
    "rewards={brightness: 1.0}",
    "window_shift_every=1",
    "clip_range=1e-4",
]
BATCHES = {
    "whole": [],
    "split": ["rollout_micro_batch=1", "train_micro_batch=1", "updates_per_rollout=2"],
}


def make_trainer(tmp_path: Path, overrides: list[str], accelerator=None) -> Trainer:
    """A Trainer of a run created in the store of ``tmp_path`` (by the main process; its id is the same on
    every rank, as the store numbers runs from 1)."""
    cfg = load_config(None, overrides, check_environment=False)
    run_dir = tmp_path / "run"
    if accelerator is None or accelerator.is_main_process:
        run_id = open_store(tmp_path).create_run(cfg.name, cfg.to_dict(), run_dir)
    else:
        run_id = 1
    return Trainer(cfg, run_id, str(tmp_path), accelerator=accelerator, run_dir=run_dir)


def base_sigmas(trainer: Trainer) -> torch.Tensor:
    """The schedule's own σ (T + 1,), built here from the model and the config, not from the trainer's state."""
    cfg = trainer.cfg
    if cfg.resolved_schedule() == "pipeline":
        return trainer.model.pipeline_sigmas(cfg.sampling_steps).double()
    return make_sigmas(cfg.sampling_steps, cfg.shift)


class Spy:
    """Records every model call's σ and what the trainer's phases returned."""

    def __init__(self, trainer: Trainer):
        self.calls: list[tuple[tuple[float, ...], bool]] = []
        self.trajs, self.results, self.checked, self.sampled = [], [], [], []
        trainer.model.register_forward_pre_hook(self.hook)
        sample, update_phase = trainer.sample, trainer.update_phase

        def spy_sample(step, prompts):
            self.take()
            traj = sample(step, prompts)
            self.sampled.append({c[0][0] for c in self.take()})  # the σ of the rollout's model calls
            self.trajs.append(traj)
            self.checked.append(recover_noise(trainer, traj))  # at the policy that sampled
            return traj

        def spy_update(step, traj, adv):
            results, norms = update_phase(step, traj, adv)
            self.results.append(results)
            return results, norms

        trainer.sample, trainer.update_phase = spy_sample, spy_update

    def hook(self, module, args):
        t = args[1]
        self.calls.append(
            (tuple(sorted({round(float(x), 6) for x in t}, reverse=True)), torch.is_grad_enabled())
        )

    def take(self) -> list[tuple[tuple[float, ...], bool]]:
        calls, self.calls = self.calls, []
        return calls


@torch.no_grad()
def recover_noise(trainer: Trainer, traj) -> tuple[torch.Tensor, float]:
    """ε of every SDE step (n_sde, B·D), recovered as (z_{j+1} − μ_j)/std_j at the sampling policy, and the
    largest difference between the recomputed log-probs and the rollout's."""
    eps, worst = [], 0.0
    for j in traj.sde_steps:
        z = traj.latents[j]
        v = trainer.model(z, traj.sigmas[j].expand(z.shape[0]), traj.cond)
        out = trainer.sampler.step(v, z, j, traj.sigmas, prev_sample=traj.latents[j + 1])
        eps.append(((traj.latents[j + 1] - out.mean) / out.std).flatten())
        worst = max(worst, float((out.log_prob - traj.log_probs[j]).abs().max()))
    return torch.stack(eps), worst


def corr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    a, b = a - a.mean(), b - b.mean()
    return float((a @ b) / (a.norm() * b.norm()))


def check_step(trainer: Trainer, spy: Spy) -> dict:
    cfg = trainer.cfg
    base = base_sigmas(trainer)
    eval_grid = {round(float(s), 6) for s in base[:-1]}
    evaluates = trainer.main or trainer.fsdp  # other ranks skip the eval
    trainer.evaluate(0)
    assert not evaluates or {c[0][0] for c in spy.take()} == eval_grid  # the eval walks the schedule's σ
    metrics = trainer.train_step(1)
    (traj,) = spy.trajs
    spy.take()
    trainer.evaluate(1)
    assert not evaluates or {c[0][0] for c in spy.take()} == eval_grid  # and again after a training step

    # --- the rollout's grid
    start, end = cfg.sde_window_at(1)
    sde = traj.sde_steps
    assert len(sde) == end - start
    sig = traj.sigmas.double().cpu()
    torch.testing.assert_close(sig[sde[0] : sde[-1] + 2], base[start : end + 1], atol=1e-6, rtol=0)
    assert float(sig[0]) == pytest.approx(float(base[0])) and float(sig[-1]) == 0.0
    n_after = (
        0
        if end == cfg.sampling_steps
        else min(cfg.ode_steps_after or cfg.sampling_steps, cfg.sampling_steps - end)
    )
    n_before = start if cfg.ode_steps_before is None else min(cfg.ode_steps_before, start)
    assert sde[0] == n_before and len(sig) - 1 == n_before + (end - start) + n_after
    assert (sig[1:] < sig[:-1]).all()
    assert spy.sampled[0] == {round(float(s), 6) for s in sig[:-1]}  # the model was called on that grid

    # --- the SDE noise: independent of z_0, across SDE steps and training steps; log-probs recomputed
    eps, logp_err = spy.checked[0]
    assert logp_err < 1e-5
    n = eps.shape[1]
    bound = 6 / math.sqrt(n)
    z0 = traj.latents[0].flatten()
    for k in range(len(eps)):
        assert abs(corr(eps[k], z0)) < bound, ("eps vs z0", k, corr(eps[k], z0))
        assert float(eps[k].std()) == pytest.approx(1.0, abs=8 / math.sqrt(n))
        for m in range(k):
            assert abs(corr(eps[k], eps[m])) < bound, ("eps across SDE steps", k, m)
    prompts, _ = trainer.step_prompts(2)
    traj2 = trainer.sample(2, prompts)
    eps2, _ = spy.checked[1]
    assert abs(corr(eps2[0], eps[0])) < bound and abs(corr(traj2.latents[0], traj.latents[0])) < bound

    # --- the update: on-policy first mini-batch, counts as planned
    (results,) = spy.results
    first = results[0]
    assert first.ratio_mean == pytest.approx(1.0, abs=1e-6) and first.clipfrac == 0.0
    plan = route_groups(sde, cfg.strategy, cfg.window, cfg.jagg_frac)
    micro = cfg.train_micro_batch or traj.batch_size // cfg.updates_per_rollout
    chunks = math.ceil(traj.batch_size // cfg.updates_per_rollout / micro)
    want = {"grad": 0, "nograd_or_reused": 0, "backward": 0}
    for steps, kind in plan:
        if len(steps) == 1 or kind == "exact":
            want["grad"] += len(steps)
            want["backward"] += len(steps)
        else:
            want["grad"] += 1  # the two endpoints in one batched call
            want["backward"] += 1
            want["nograd_or_reused"] += len(steps) - 2 if kind == "jagg" else 0
    for result in results:
        c = result.counts
        assert c.forward_grad == chunks * want["grad"] and c.backward == chunks * want["backward"]
        assert c.forward_nograd + c.reused == chunks * want["nograd_or_reused"]
    G, shared = cfg.group_size, cfg.group_noise == "shared"
    calls_a_sample = (n_before / G if shared else n_before) + (end - start) + n_after
    assert metrics["count/sampling_forward"] == pytest.approx(calls_a_sample)

    # --- what is logged
    assert (metrics["sampler/window_start"], metrics["sampler/window_end"]) == (start, end)
    assert metrics["sampler/sigma_window_start"] == pytest.approx(float(base[start]))
    assert metrics["sampler/sigma_window_end"] == pytest.approx(float(base[end]))
    return {"eps": eps, "z0": z0, "bound": bound}


SHAPES_COMBOS = list(
    itertools.product(
        ("exact", "jagg", "endpoint"), ("fixed", "sliding"), ("independent", "shared"), ("euler", "dpmpp-2m")
    )
)


@pytest.mark.parametrize("strategy, window_schedule, group_noise, ode_solver", SHAPES_COMBOS)
def test_trainer_step_invariants_tiny_shapes(tmp_path, strategy, window_schedule, group_noise, ode_solver):
    batches = BATCHES[
        ("whole", "split")[SHAPES_COMBOS.index((strategy, window_schedule, group_noise, ode_solver)) % 2]
    ]
    extra = ["window=3"] if window_schedule == "fixed" else []  # fixed: one 3-step group, with an inner step
    trainer = make_trainer(
        tmp_path,
        [
            *TINY,
            *extra,
            f"strategy={strategy}",
            f"sde_window_schedule={window_schedule}",
            f"group_noise={group_noise}",
            f"ode_solver={ode_solver}",
            *batches,
        ],
    )
    check_step(trainer, Spy(trainer))


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline
    from test_schedule import FLUX1_SCHEDULER

    flux = tmp_path_factory.mktemp("inv-flux")
    save_tiny_flux(str(flux))
    pipe = FluxPipeline.from_pretrained(str(flux))
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(**FLUX1_SCHEDULER)  # FLUX.1's dynamic shift
    pipe.save_pretrained(str(flux))
    sd3 = tmp_path_factory.mktemp("inv-sd3")
    save_tiny_sd3(str(sd3))
    prompts = flux / "prompts.txt"
    prompts.write_text("a red cat\na blue dog\na green bird\n")
    return {"flux": str(flux), "sd3": str(sd3), "prompts": str(prompts)}


@pytest.mark.parametrize("backbone", ["flux", "sd3"])
@pytest.mark.parametrize("strategy", ["exact", "jagg", "endpoint"])
@pytest.mark.parametrize("batches", ["whole", "split"])
def test_trainer_step_invariants_pipeline_schedule(tmp_path, pipelines, backbone, strategy, batches):
    trainer = make_trainer(
        tmp_path,
        [
            *TINY,
            f"backbone={backbone}",
            f"model_path={pipelines[backbone]}",
            f"prompts_file={pipelines['prompts']}",
            "lora_rank=4",
            "backbone_options={resolution: 8, max_sequence_length: 6}",
            f"strategy={strategy}",
            *BATCHES[batches],
        ],
    )
    assert trainer.cfg.resolved_schedule() == "pipeline"
    base = base_sigmas(trainer)
    assert (base - make_sigmas(6)).abs().max() > 1e-3  # not the uniform grid: a schedule lost would show
    check_step(trainer, Spy(trainer))


# ------------------------------------------------------------------------------------------------ distribution


def affine_moments(trainer: Trainer, traj) -> list[tuple[float, float]]:
    """Mean and std of z_j at every grid step that the sampler's own steps give from z_0 ~ N(0, I) and
    independent N(0, 1) SDE noise: each step of gauss-toy is elementwise affine, z' = a·z + b + std·ξ
    (a, b read off the step at z = 0 and z = 1 with zero noise), so mean' = a·mean + b, var' = a²·var + std²."""
    sig = traj.sigmas
    one = torch.ones(1, *trainer.model.latent_shape, dtype=sig.dtype)
    mean, var, out = 0.0, 1.0, [(0.0, 1.0)]
    for j in range(len(sig) - 1):

        def step(z, j=j):
            v = trainer.model(z, sig[j].expand(1), None)
            if j in traj.sde_steps:
                o = trainer.sampler.step(v, z, j, sig, noise=torch.zeros_like(z))
                return o.mean, float(o.std)
            return ode_step(v, z, sig[j], sig[j + 1]), 0.0

        with torch.no_grad():
            b, std = step(0 * one)
            a = step(one)[0] - b
        a, b = float(a.flatten()[0]), float(b.flatten()[0])
        mean, var = a * mean + b, a * a * var + std * std
        out.append((mean, math.sqrt(var)))
    return out


# The data's marginal holds up to the discretisation for the marginal-preserving SDEs at 12 steps (measured
# here: flow-grpo within 10 %, its first steps use σ_1 for σ = 1; dance within 8 %). cps keeps the marginal only
# when x̂0 and ε̂ are the sample's own x0 and ε; with the posterior means of Gaussian data it loses variance
# (−18 % at the end), so only the sampler's own moments are checked for it.
DATA_TOLERANCE = {"flow-grpo": 0.10, "dance": 0.08, "cps": None}


@pytest.mark.parametrize("kind", ["flow-grpo", "dance", "cps"])
@pytest.mark.parametrize("group_noise", ["independent", "shared"])
def test_rollout_latents_have_the_analytic_mean_and_std(tmp_path, kind, group_noise):
    trainer = make_trainer(
        tmp_path,
        [
            "backbone=gauss-toy",
            f"algorithm={kind}",
            "sampling_steps=12",
            "sde_window_start=0",
            "sde_window_end=8",
            "sde_window_schedule=fixed",
            "window=4",
            f"group_noise={group_noise}",
            "ode_solver=euler",
            "ode_steps_after=null",
            "group_size=8",
            "prompts_per_step=64",
            "rewards={brightness: 1.0}",
            "eval_every=0",
        ],
    )
    prompts, _ = trainer.step_prompts(1)
    traj = trainer.sample(1, prompts)
    B, D = traj.latents.shape[1:]
    n_eff = (
        B // 8 if group_noise == "shared" else B
    ) * D  # shared noise: the 8 samples of a group start alike
    tol = 5 / math.sqrt(n_eff)
    m = trainer.model
    for j, (mean, std) in enumerate(affine_moments(trainer, traj)):
        z = traj.latents[j].double()
        assert float(z.mean()) == pytest.approx(mean, abs=tol * std), (kind, j, "mean")
        assert float(z.std()) == pytest.approx(std, rel=tol * 1.5), (kind, j, "std")
        data_mean, data_std = m.marginal(float(traj.sigmas[j]))
        if DATA_TOLERANCE[kind] is not None:
            assert float(z.mean()) == pytest.approx(data_mean, abs=0.02)
            assert float(z.std()) == pytest.approx(data_std, rel=DATA_TOLERANCE[kind]), (kind, j, "data std")


# ------------------------------------------------------------------------------------------------ two processes


def test_trainer_step_invariants_on_two_processes(tmp_path):
    out = tmp_path / "invariants.json"
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    from test_multinode import free_port

    cmd += ["--main_process_port", str(free_port()), str(ROOT / "tests/dist/invariants.py"), str(out)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert len(report["combos"]) == 4
    for combo in report["combos"]:
        assert combo["ranks"] == [0, 1], combo
        assert combo["failures"] == [], combo
        assert abs(combo["cross_rank_corr"]) < combo["bound"], combo

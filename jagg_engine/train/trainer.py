"""The GRPO trainer: setup / rollout / score / update / log / save, each short, calling the engine's math.

Run through ``jagg train`` (jagg_engine.train.launch), in one process or under ``accelerate launch``. Ranks:
every rank samples its own share of the step's prompts (whole prompt groups stay on one rank), rewards are
gathered so that advantages are normalised over the full batch exactly as in one process, each rank
accumulates the policy gradient of its samples, and the gradients are averaged across ranks before the
optimizer step. Only the main process writes (store, images, checkpoints, log). On several machines only
machine 0 has the store: global rank 0 reads the run and sends its id and config to every rank
(:func:`share_run`), and the latest checkpoint likewise (:meth:`Trainer.read_latest_checkpoint`).

Step numbering: step 0 is the evaluation before training; step s = 1 … steps is one rollout batch and one
optimizer step. A checkpoint taken after step s resumes at step s + 1; the prompts and noise of step s are
drawn from generators seeded by (seed, s, rank), so a resumed run replays exactly the steps it missed.

Training time (:class:`TrainingClock`): each step logs ``time/train_elapsed``, the wall seconds of training
from step 1 to the end of this step's update with every eval left out, and ``time/unix``, the Unix time of
that instant; an eval logs its own seconds as ``time/eval``. A curve of eval reward against training time is
thus rebuilt from the store alone (``jagg race``).

The parts live in modules of their own (the step's helpers are still importable from here):
:mod:`jagg_engine.train.steps` (the model, the sampler, the prompts and mini-batches of a step, the gradient
average), :mod:`jagg_engine.train.metrics` (memory, update metrics, :class:`TrainingClock`) and
:mod:`jagg_engine.train.files` (atomic writes, the space reserve). The process that runs a Trainer
(``python -m jagg_engine.train.process``: :func:`~jagg_engine.train.process.train`, its ``main``, logging, signals,
``share_run``) is :mod:`jagg_engine.train.process`, which imports this module, never the other way; a checkpoint is loaded into the
parameters and optimizer by :func:`jagg_engine.train.checkpoint.restore`. This module keeps the
:class:`Trainer`, the orchestration of one run, and the step's random streams and rollout.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor
from tqdm import tqdm

from jagg_engine.bias import LiveBias
from jagg_engine.credit import auto_jagg_frac
from jagg_engine.grpo import group_advantages
from jagg_engine.jagg import UpdateResult, policy_update, reuse_steps
from jagg_engine.probe import probe_groups
from jagg_engine.rewards.registry import WeightedReward
from jagg_engine.sde import SamplerConfig, Trajectory, eval_noise, ode_sample, rollout
from jagg_engine.store import ClaimError, RunStore, open_store
from jagg_engine.streams import torch_stream
from jagg_engine.train import checkpoint
from jagg_engine.train.config import TrainConfig
from jagg_engine.train.files import SPACE_RESERVE as SPACE_RESERVE
from jagg_engine.train.files import SPACE_RESERVE_BYTES as SPACE_RESERVE_BYTES
from jagg_engine.train.files import reserve_space as reserve_space
from jagg_engine.train.files import save_pngs
from jagg_engine.train.files import write_atomic as write_atomic
from jagg_engine.train.metrics import TrainingClock, memory_metrics, update_metrics
from jagg_engine.train.steps import (
    TrainingError,
    average_gradients,
    build_model,
    minibatch_indices,
    pipeline_schedule,
    prompt_source,
    rank_prompts,
    sampler_config,
    shard_fsdp2,
    window_sigmas,
)
from jagg_engine.train.steps import epoch_prompt_indices as epoch_prompt_indices

log = logging.getLogger("jagg.train")


def step_generator(
    cfg: TrainConfig, step: int, rank: int, purpose: str, device: torch.device | str = "cpu"
) -> torch.Generator:
    """The torch stream ``purpose`` ("init_noise", "sde_noise", …: :mod:`jagg_engine.streams`) of step
    ``step`` on ``rank``: independent of every other stream, the same after a resume."""
    return torch_stream(cfg.seed, step, rank, purpose, device)


def sample_rollout(
    cfg: TrainConfig,
    model: Any,
    sampler: SamplerConfig,
    update: Any,
    step: int,
    rank: int,
    prompts: list[str],
    device: torch.device,
    dtype: torch.dtype,
) -> Trajectory:
    """Rank ``rank``'s rollout of training step ``step``: its initial and SDE noise from the step's streams,
    the prompts encoded, the velocities the ``update`` can reuse kept. With group_noise shared the G samples
    of a prompt start from one noise and their steps before the window are computed once."""
    gen = step_generator(cfg, step, rank, "init_noise")
    sde_gen = step_generator(cfg, step, rank, "sde_noise", device)
    G, shared = cfg.group_size, cfg.group_noise == "shared"
    n = len(prompts) // G if shared else len(prompts)
    noise = torch.randn(n, *model.latent_shape, generator=gen, dtype=torch.float32)
    if shared:
        noise = noise.repeat_interleave(G, 0)  # (B, *S): one noise per group
    with torch.no_grad():
        cond = model.encode_prompts(prompts)
    # only the velocities the update can read: the inner steps of its JAGG groups (none: no policy state)
    keep = reuse_steps(sampler.grid().sde_steps, update)
    return rollout(
        model,
        cond,
        noise.to(device, dtype),
        sampler,
        sde_gen,
        store_velocities=keep,
        micro_batch=cfg.rollout_micro_batch,
        prefix_group=G if shared else None,
    )


# ------------------------------------------------------------------------------------------------ trainer


class StepCancelled(Exception):
    """A stop asked for during a step's rollout (:meth:`Trainer.train_step`): the step ends before its update,
    so no parameter changed and the run stops at the step before, within one step of the request."""


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        run_id: int,
        runs_dir: str,
        resume: bool = False,
        accelerator: Any = None,
        run_dir: str | os.PathLike[str] | None = None,
        from_scratch: bool = False,
    ):
        """``from_scratch`` (with ``resume``): the run starts over from step 0 instead of its last checkpoint
        (see :meth:`start_over`)."""
        from accelerate import Accelerator

        self.cfg, self.run_id, self.resume = cfg, run_id, resume
        self.from_scratch, self.runs_dir = resume and from_scratch, runs_dir
        self.acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.main = self.acc.is_main_process
        self.world, self.rank = self.acc.num_processes, self.acc.process_index
        # Only global rank 0 opens the runs database; the other ranks (other machines too) never touch it.
        self.store: RunStore | None = open_store(runs_dir) if self.main else None
        row = self.store.get_run(run_id) if self.main else None  # None: a harness without a run (tests)
        self.run_uid = row["uid"] if row else None  # its checkpoints carry it
        if run_dir is None:
            run_dir = (self.store or open_store(runs_dir)).get_run(run_id)["run_dir"]
        self.run_dir = Path(run_dir)
        self.stop_signal = False
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg, self.acc.device)
        self.fsdp = cfg.fsdp and self.world > 1
        if self.fsdp:
            shard_fsdp2(self.model)  # parameters become DTensor shards: collect them after sharding
            self.params = [p for p in self.model.parameters() if p.requires_grad]
        else:
            self.params = self.model.trainable_parameters()
        if not self.params:
            raise TrainingError("backbone: the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.reward = WeightedReward(cfg.rewards, cfg.reward_options)
        if row is not None:  # a reward that asks the run's person (picks) learns which run it asks for
            self.reward.bind(
                store=self.store,
                run_id=run_id,
                run_dir=self.run_dir,
                group_size=cfg.group_size,
                steps=cfg.steps,
            )
        self.schedule = pipeline_schedule(cfg, self.model)  # the pipeline's σ grid, or None (shifted-linear)
        self.sampler, self.update = sampler_config(cfg, self.schedule), cfg.update_config()
        self.prompts = prompt_source(cfg)
        self.eval_prompts = prompt_source(cfg, eval_set=True)[: cfg.eval_num_prompts]
        self.start_step = 1
        # Parameter writes so far (optimizer steps, checkpoint loads), and their count when the last rollout
        # sampled: reuse of its velocities is allowed only while the two are equal (update_phase).
        self.policy_writes, self.rollout_writes = 0, -1
        # JAGG's expected-gradient bias followed over the probes (bias/rel_live, bias/along_live on probe steps)
        self.live_bias, self.bias_metrics = LiveBias(), {}

    # -------------------------------------------------------------------------------- one step, in phases
    def step_prompts(self, step: int) -> tuple[list[str], torch.Tensor]:
        """This rank's prompts, each repeated group_size times, and their global group ids. (B,), B = P·G."""
        return rank_prompts(self.cfg, self.prompts, step, self.rank, self.world)

    def sample(self, step: int, prompts: list[str]) -> Trajectory:
        """This rank's rollout of step ``step`` with the step's sampler (its SDE window): :func:`sample_rollout`."""
        self.rollout_writes = self.policy_writes  # the policy this rollout samples
        return sample_rollout(
            self.cfg, self.model, self.sampler, self.update, step, self.rank, prompts, self.acc.device,
            self.params[0].dtype,
        )  # fmt: skip

    def score(
        self, traj: Trajectory, prompts: list[str], step: int | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], Any]:
        """Decode and score a rollout; ``step`` is the training step (a reward that asks a person, picks,
        asks about this step's groups), None for scoring that asks nobody."""
        images = self.model.decode(traj.latents[-1])
        self.reward.set_step(step)
        total, parts = self.reward(images, prompts)
        return total, parts, images

    def advantages(self, rewards: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages of this rank's samples, normalised over the rewards of ALL ranks; and the gathered rewards."""
        all_rewards = self.acc.gather(rewards.to(self.acc.device)).cpu()
        all_groups = self.acc.gather(groups.to(self.acc.device)).cpu()
        adv = group_advantages(all_rewards, all_groups, std=self.cfg.adv_std, clip=self.cfg.adv_clip)
        n = rewards.shape[0]
        return adv[self.rank * n : (self.rank + 1) * n], all_rewards

    def optimize(self, step: int) -> float:
        """Average (data parallel), clip and apply the gradients. Finite or failed: a non-finite gradient
        (norm NaN or inf) stops the run before the optimizer step, and weights that the step made non-finite
        (an lr that overflows them) stop it after; either way no checkpoint of them is written. Every rank
        reaches the same verdict (the norm is global; under FSDP the weight check is reduced)."""
        if self.world > 1 and not self.fsdp:  # FSDP2 reduce-scatters the gradients itself
            average_gradients(self.params, self.world)
        clip = self.cfg.grad_clip if self.cfg.grad_clip else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if not math.isfinite(norm):
            raise TrainingError(
                f"grad: non-finite gradient (norm {norm}) at step {step}; the step was not applied"
            )
        self.optimizer.step()
        self.policy_writes += 1  # the rollout's velocities are stale from here on
        self.optimizer.zero_grad(set_to_none=True)
        bad = self.non_finite_parameters()
        if bad:
            raise TrainingError(
                f"weights: {bad} non-finite value(s) after the optimizer step of step {step}"
                f" (lr {self.optimizer.param_groups[0]['lr']:g}); the run stops, no checkpoint of them is written"
            )
        return norm

    def non_finite_parameters(self) -> int:
        """How many trainable parameter values are NaN or inf (this rank's shards summed over the ranks
        under FSDP; replicated parameters are the same on every rank)."""
        with torch.no_grad():
            count = sum(
                int((~torch.isfinite(p.to_local() if isinstance(p, DTensor) else p)).sum())
                for p in self.params
            )
        if self.fsdp:
            count = int(self.acc.reduce(torch.tensor(count, device=self.acc.device), reduction="sum"))
        return count

    def update_phase(
        self, step: int, traj: Trajectory, adv: torch.Tensor
    ) -> tuple[list[UpdateResult], list[float]]:
        """The update phase: ``updates_per_rollout`` = M mini-batches of this rank's samples, one optimizer step
        each (Flow-GRPO's several steps per sampling epoch). Advantages were normalised over the whole rollout
        batch of all ranks before the split; the old log-probs are the rollout's, so on mini-batch m > 1 the
        PPO ratio compares the updated policy with the sampling one. Mini-batch m is the m-th slice of a
        permutation seeded by (seed, step, rank): a resumed run replays it.

        Velocity reuse is decided here first: only the first mini-batch may reuse, and only if no optimizer
        step, checkpoint load or other parameter write (:attr:`policy_writes`) happened since the rollout;
        the engine's guard (:func:`jagg_engine.jagg.can_reuse_velocities`) is the second check.
        """
        results, norms = [], []
        # the control variate's draws (cv_frac > 0): their own stream of (seed, step, rank), one draw per JAGG
        # group and mini-batch, so a resumed run draws the same samples
        cv_gen = (
            step_generator(self.cfg, step, self.rank, "control_variate") if self.update.cv_frac > 0 else None
        )
        if self.update.strategy == "pair":  # strategy pair's draws: their own stream, the same after a resume
            cv_gen = step_generator(self.cfg, step, self.rank, "pair")
        for m, index in enumerate(minibatch_indices(self.cfg, step, self.rank, traj.batch_size)):
            part = traj if index is None else traj.select(index)
            part_adv = adv if index is None else adv[index]
            fresh = m == 0 and self.policy_writes == self.rollout_writes
            result = policy_update(
                self.model,
                part,
                part_adv.to(self.acc.device),
                self.update,
                self.sampler,
                self.ref_model(),
                rollout_policy=fresh,
                generator=cv_gen,
            )
            if not math.isfinite(result.loss):
                raise TrainingError(f"loss: non-finite policy loss at step {step}; the step was not applied")
            norms.append(self.optimize(step))
            results.append(result)
        return results, norms

    def ref_model(self):
        """The reference policy for the KL term: the adapter disabled (LoRA) or the initial weights."""
        if self.cfg.beta <= 0:
            return None
        reference = getattr(self.model, "reference_velocity", None)
        if reference is None:
            raise TrainingError(f"beta: backbone {self.cfg.backbone} has no reference policy; use beta=0")
        return reference

    def train_step(self, step: int) -> dict[str, float]:
        if self.acc.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.acc.device)
        t0 = time.perf_counter()
        # The step's sampler: under a sliding schedule its SDE window is a function of the step (a resumed run
        # continues the schedule); the update, the probe and routing read the same one.
        self.sampler = sampler_config(self.cfg, self.schedule, step)
        planned = self.cfg.update_config(step)  # jagg_from_step / jagg_until_step: this step's backward
        if self.update.strategy != planned.strategy:  # (keeping an auto-routed jagg_frac)
            self.update = dataclasses.replace(
                self.update,
                strategy=planned.strategy,
                cv_frac=planned.cv_frac,
                pair_cv=planned.pair_cv,
                pair_frac=planned.pair_frac,
            )
            names = {"jagg": "JAGG", "exact": "the exact backward", "pair": "strategy pair"}
            log.info("step %d: %s from this step on", step, names.get(planned.strategy, planned.strategy))
        window = self.cfg.sde_window_at(step)
        sigma_start, sigma_end = window_sigmas(self.sampler)
        prompts, groups = self.step_prompts(step)
        traj = self.sample(step, prompts)
        t1 = time.perf_counter()
        total, parts, images = self.score(traj, prompts, step)
        if self.should_stop():  # asked to stop during the rollout (the step's longest part): no update
            raise StepCancelled(step)
        adv, all_rewards = self.advantages(total, groups)
        if not torch.isfinite(all_rewards).all():
            raise TrainingError(f"reward: non-finite reward at step {step}")
        t_probe = time.perf_counter()
        # Routing and the fidelity probe see this rollout at the parameters that produce the applied gradient.
        routed, self.bias_metrics = None, {}
        if self.cfg.auto_route and (step == self.start_step or step % self.cfg.auto_route_every == 0):
            routed = self.route(step, traj, adv)
        if self.cfg.probe_every and step % self.cfg.probe_every == 0 and routed is None:
            self.probe(step, traj, adv)
        t2 = time.perf_counter()
        results, grad_norms = self.update_phase(step, traj, adv)
        t3 = time.perf_counter()
        metrics = {
            "reward/mean": float(all_rewards.mean()),
            "reward/std": float(all_rewards.std(unbiased=False)),
            **{f"reward/{k}/mean": float(v.mean()) for k, v in parts.items()},
            **{f"reward/{k}/std": float(v.std(unbiased=False)) for k, v in parts.items()},
            **update_metrics(results),
            "grad/norm": float(np.mean(grad_norms)),
            "lr": self.optimizer.param_groups[0]["lr"],
            "time/sampling": t1 - t0,
            "time/reward": t_probe - t1,
            "time/probe": t2 - t_probe,  # the fidelity probe and auto_route's probe (0 on other steps)
            "time/step": t3 - t0,
            "route/jagg_frac": self.update.jagg_frac,
            "route/jagg": float(self.update.strategy == "jagg"),  # 0 on steps outside jagg_from/until_step
            "sampler/window_start": float(window[0]),
            "sampler/window_end": float(window[1]),
            "sampler/sigma_window_start": sigma_start,
            "sampler/sigma_window_end": sigma_end,
            "count/sampling_forward": traj.forwards,
            **self.bias_metrics,
            **self.reward.step_metrics(),
            **memory_metrics(self.acc.device),
        }
        if self.main and self.cfg.sample_every and step % self.cfg.sample_every == 0:
            self.save_train_samples(step, prompts, images, total)
        return metrics

    # -------------------------------------------------------------------------------- side effects (main only)
    def save_images(self, folder: str, images: torch.Tensor, names: list[str]) -> list[str]:
        """PNGs of ``images`` named ``names`` in the run folder's ``folder``; their paths relative to the run
        folder (:func:`jagg_engine.train.files.save_pngs`)."""
        return save_pngs(self.run_dir, folder, images, names)

    def save_train_samples(
        self, step: int, prompts: list[str], images: torch.Tensor, rewards: torch.Tensor
    ) -> None:
        G = self.cfg.group_size
        idx = list(range(0, len(prompts), G))[:8]  # the first sample of up to 8 groups
        paths = self.save_images(f"samples/train/step_{step:05d}", images[idx], [f"{i}.png" for i in idx])
        self.store.log_samples(
            self.run_id,
            step,
            [
                {"kind": "train", "prompt": prompts[i], "seed": None, "reward": float(rewards[i]), "path": p}
                for i, p in zip(idx, paths)
            ],
        )

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """Deterministic ODE samples of the fixed eval prompts × seeds; images saved and logged by the main process.

        Under FSDP every rank runs the sampling (each forward needs every rank's shard); only the main one writes.
        """
        if not (self.main or self.fsdp):
            return {}
        started = time.perf_counter()
        prompts = [p for _ in self.cfg.eval_seeds for p in self.eval_prompts]
        seeds = [s for s in self.cfg.eval_seeds for _ in self.eval_prompts]
        noise = torch.stack(
            [
                eval_noise(self.model.latent_shape, i, s)
                for i, s in zip(list(range(len(self.eval_prompts))) * len(self.cfg.eval_seeds), seeds)
            ]
        )
        dtype = self.params[0].dtype
        self.reward.set_step(None)  # an eval asks nobody
        images, totals, parts_all = [], [], []
        for i in range(0, len(prompts), 64):
            chunk = prompts[i : i + 64]
            z = ode_sample(
                self.model,
                self.model.encode_prompts(chunk),
                noise[i : i + 64].to(self.acc.device, dtype),
                self.cfg.sampling_steps,
                self.cfg.shift,
                self.schedule,
            )
            img = self.model.decode(z)
            total, parts = self.reward(img, chunk)
            images.append(img)
            totals.append(total)
            parts_all.append(parts)
        if not self.main:
            return {}
        images, totals = torch.cat(images), torch.cat(totals)
        names = [f"{i:03d}_seed{s}.png" for i, s in zip(range(len(prompts)), seeds)]
        paths = self.save_images(f"samples/eval/step_{step:05d}", images, names)
        self.store.log_samples(
            self.run_id,
            step,
            [
                {"kind": "eval", "prompt": p, "seed": s, "reward": float(r), "path": path}
                for p, s, r, path in zip(prompts, seeds, totals, paths)
            ],
        )
        metrics = {
            "eval/reward/mean": float(totals.mean()),
            "eval/reward/std": float(totals.std(unbiased=False)),
            "time/eval": time.perf_counter() - started,  # sampling, scoring, images and their rows
        }
        for k in parts_all[0]:
            metrics[f"eval/reward/{k}/mean"] = float(torch.cat([p[k] for p in parts_all]).mean())
        return metrics

    def route(self, step: int, traj: Trajectory, adv: torch.Tensor) -> list:
        """auto_route: probe this rollout's groups and route the leading ones above the threshold to JAGG.

        Decided once for all ranks: the probe's gradients are summed over the ranks (the cosines are those of
        the whole batch), and rank 0's jagg_frac is broadcast, so every rank updates with the same routing
        and the logged ``route/jagg_frac`` is the one used. Returns the probe rows.
        """
        rows = self.probe(step, traj, adv, n=16)
        frac = auto_jagg_frac([r.cosine for r in rows], self.cfg.auto_route_threshold)
        if self.world > 1:
            from accelerate.utils import broadcast_object_list

            box = [frac]
            broadcast_object_list(box, from_process=0)
            frac = box[0]
        log.info(
            "step %d: auto routing, jagg_frac %.3f (cosines %s)",
            step,
            frac,
            ", ".join(f"{r.cosine:.3f}" for r in rows),
        )
        self.update = dataclasses.replace(self.update, jagg_frac=frac)
        return rows

    def probe(self, step: int, traj: Trajectory, adv: torch.Tensor, n: int = 8) -> list:
        """Gradient fidelity on (up to) the first ``n`` samples of this rollout on every rank; the same engine
        routines as the update. Each group's JAGG and exact gradients are summed over the ranks before the
        cosine, so every rank gets the same rows: those of the batch of all ranks' probed samples. Only the
        main process writes them.
        """
        n = min(n, traj.batch_size)
        sub = traj.select(slice(0, n))
        saved = [None if p.grad is None else p.grad.clone() for p in self.params]
        reduce = None
        if self.world > 1:
            reduce = lambda t: self.acc.reduce(t, reduction="sum")  # noqa: E731
        rows, _ = probe_groups(
            self.model,
            self.params,
            sub,
            adv[:n].to(self.acc.device),
            self.update,
            self.sampler,
            reduce=reduce,
            totals=lambda exact, jagg: self.bias_metrics.update(self.live_bias.update(exact, jagg)),
        )
        for p, g in zip(self.params, saved):
            p.grad = g
        if self.main:
            self.store.log_probes(
                self.run_id,
                step,
                [
                    {
                        "group_index": r.index,
                        "t_start": r.t_start,
                        "t_end": r.t_end,
                        "cosine": r.cosine,
                        "rel_error": r.rel_error,
                    }
                    for r in rows
                ],
            )
        return rows

    # -------------------------------------------------------------------------------- checkpoints
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def gather_strings(self, value: str) -> list[str]:
        """Every rank's string, in rank order (how the ranks agree on a checkpoint's outcome)."""
        if self.world == 1:
            return [value]
        from accelerate.utils import gather_object

        return list(gather_object([value]))

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (how a checkpoint read on machine 0 reaches the others)."""
        if self.world == 1:
            return value
        from accelerate.utils import broadcast_object_list

        box = [value]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def save_checkpoint(self, step: int) -> None:
        """Trainable weights (gathered in full under FSDP), optimizer, RNG states and step: see
        :mod:`jagg_engine.train.checkpoint` (safetensors + JSON, sha256 manifest, atomic, pruned)."""
        params = [(p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu() for p in self.params]
        checkpoint.save(
            self.checkpoint_dir(),
            step,
            params,
            self.optimizer.state_dict() if (self.fsdp or self.main) else {},
            rank=self.rank,
            world=self.world,
            sharded=self.fsdp,
            keep=self.cfg.keep_checkpoints,
            gather=self.gather_strings,
            local_main=self.acc.is_local_main_process,
            run_uid=self.run_uid,
        )

    def load_checkpoint(self) -> int:
        """Restore the newest intact checkpoint of THIS run (refused ones are named in the log: other runs'
        checkpoints, and any past the run's last logged step); its step, or 0."""
        max_step = None
        if self.main:
            row = self.store.get_run(self.run_id)
            max_step = max(row["last_step"] or 0, 0) if row else None
        try:
            state = checkpoint.load_latest(
                self.checkpoint_dir(),
                self.rank,
                gather=self.gather_strings,
                broadcast=self.broadcast,
                run_uid=self.run_uid,
                max_step=max_step,
            )
        except checkpoint.CheckpointError as exc:  # none intact: say what the user can do
            raise checkpoint.CheckpointError(
                f"{exc}; start the run over from step 0 with `jagg train --resume {self.run_id} --from-scratch"
                f" --runs-dir {self.runs_dir}`, or start a new run with its config"
            ) from None
        if state is None:
            return 0
        if len(state.params) != len(self.params) or any(
            tuple(s.shape) != tuple(p.shape) for s, p in zip(state.params, self.params)
        ):
            raise TrainingError(f"resume: {state.path} does not match this model's trainable parameters")
        checkpoint.restore(state, self.params, self.optimizer, sharded=self.fsdp)
        self.policy_writes += 1
        return state.step

    # -------------------------------------------------------------------------------- the loop
    def elapsed_at(self, done: int) -> float:
        """Training seconds logged at step ``done`` (``time/train_elapsed``): where a resumed run's clock goes
        on. 0 before step 1; NaN when the step has no such row (a history older than the key)."""
        if done == 0 or not self.main:
            return 0.0
        step, value = self.store.last_values(self.run_id, ["time/train_elapsed"]).get(
            "time/train_elapsed", (None, None)
        )
        return float(value) if step == done and value is not None else math.nan

    def should_stop(self) -> bool:
        from accelerate.utils import broadcast_object_list

        asked = (
            self.main and self.run_uid is not None and self.store.cancel_requested(self.run_id)
        )  # a harness: no run
        flag = [bool(self.stop_signal or asked)]
        if self.world > 1:
            broadcast_object_list(flag, from_process=0)
        return flag[0]

    def start_over(self) -> None:
        """``--from-scratch``: the run goes on from step 0 in its own folder and row. Its checkpoints are moved
        aside (``checkpoints-discarded-<time>``, never read again) and every logged step is discarded through
        the history's truncation (:meth:`RunStore.truncate_after`, to step -1), so the index, the history file
        and a later reindex agree."""
        if self.acc.is_local_main_process and self.checkpoint_dir().is_dir():
            aside = self.run_dir / f"checkpoints-discarded-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(self.checkpoint_dir(), aside)
            log.info("from scratch: checkpoints moved to %s", aside)
        if self.main:
            self.store.truncate_after(self.run_id, -1)
            log.info("from scratch: every logged step discarded, starting over from step 0")
        self.acc.wait_for_everyone()

    def run(self) -> str:
        cfg = self.cfg
        done = self.load_checkpoint() if self.resume and not self.from_scratch else 0
        self.start_step = done + 1
        problem = None
        if self.main:  # the claim: only from the status this trainer was started for (compare-and-set)
            try:
                expected = ("failed", "cancelled") if self.resume else ("queued",)
                self.store.claim(self.run_id, expected, os.getpid())
            except ClaimError as exc:
                problem = str(exc)
        problem = self.broadcast(problem)
        if problem:
            raise ClaimError(problem)
        if self.from_scratch:
            self.start_over()
        elif self.main and self.resume:
            self.store.truncate_after(self.run_id, done)
            log.info("resuming after step %d", done)
        if done == 0 and cfg.eval_every:
            metrics0 = self.evaluate(0)
            if self.main:
                self.store.log_step(self.run_id, 0, {**metrics0, "time/unix": time.time()})
        bar = tqdm(
            range(done + 1, cfg.steps + 1),
            desc=f"run {self.run_id}",
            disable=not self.main,
            initial=done,
            total=cfg.steps,
            unit="step",
            dynamic_ncols=True,
        )
        last = done
        clock = TrainingClock(self.elapsed_at(done))
        for step in bar:
            if self.should_stop():
                self.save_checkpoint(last)
                return "cancelled"
            try:
                metrics = self.train_step(step)
            except StepCancelled:  # asked to stop during the rollout: the step was not applied
                self.save_checkpoint(last)
                return "cancelled"
            metrics.update(clock.lap())
            stopping = False
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
                stopping = self.should_stop()  # a stop asked during the update skips the step's eval
                if not stopping:
                    metrics.update(self.evaluate(step))
                    clock.restart()
            if self.main:
                self.store.log_step(self.run_id, step, metrics)
                bar.set_postfix(
                    reward=f"{metrics['reward/mean']:.3f}", update=f"{metrics['time/update']:.2f}s"
                )
                log.info(
                    "step %d reward %.4f loss %.3e update %.2fs",
                    step,
                    metrics["reward/mean"],
                    metrics["loss/policy"],
                    metrics["time/update"],
                )
            last = step
            if stopping:
                self.save_checkpoint(last)
                return "cancelled"
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step != cfg.steps:
                self.save_checkpoint(step)
        self.save_checkpoint(last)
        return "finished"

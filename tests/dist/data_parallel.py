"""Two trainer processes under `accelerate launch` (gloo): data-parallel gradients and routing agreement.

Writes one JSON to argv[1] (from rank 0); tests/test_multinode.py asserts on it.

1. Gradients: each rank runs step 1's rollout and update on its share of the prompts, then the trainer's
   gradient averaging; rank 0 computes the single-process gradient of the whole batch (both ranks'
   trajectories concatenated, the same advantages) and reports the largest difference, for each strategy.
2. Routing: each rank probes its OWN rollout of step 1 (no reduction); the auto_route threshold is set between
   the two ranks' first-group cosines, so deciding per rank would split the ranks. The trainer then runs with
   auto_route, every rank recording the jagg_frac that its policy updates use; the store holds the logged one.
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object

import jagg_engine.train.trainer as trainer_mod
from jagg_engine.jagg import policy_update
from jagg_engine.credit import auto_jagg_frac
from jagg_engine.probe import probe_groups
from jagg_engine.sde import Trajectory
from jagg_engine.store import open_store
from jagg_engine.train.config import load_config
from jagg_engine.train.trainer import Trainer, average_gradients

SMALL = ["prompts_per_step=2", "group_size=4", "sampling_steps=6", "sde_window_end=6", "eval_every=0"]
SMALL += ["sample_every=0", "processes=2", "lr=1e-2"]


def flat_grad(params) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])


def gradients(acc: Accelerator, runs_dir: Path, strategy: str) -> dict:
    cfg = load_config(None, [*SMALL, f"strategy={strategy}", "window=3"])
    t = Trainer(cfg, 0, str(runs_dir), accelerator=acc, run_dir=runs_dir / "grads")
    prompts, groups = t.step_prompts(1)
    traj = t.sample(1, prompts)
    total, _, _ = t.score(traj, prompts)
    adv, _ = t.advantages(total, groups)
    policy_update(t.model, traj, adv, t.update, t.sampler)
    local = flat_grad(t.params).clone()
    average_gradients(t.params, t.world)
    averaged = flat_grad(t.params).clone()
    parts = gather_object([(prompts, traj.latents, traj.log_probs, adv)])
    if not acc.is_main_process:
        return {}
    for p in t.params:  # the same parameters (no optimizer step), one process, the whole batch
        p.grad = None
    whole = Trajectory(
        latents=torch.cat([x[1] for x in parts], dim=1),
        log_probs=torch.cat([x[2] for x in parts], dim=1),
        sigmas=traj.sigmas,
        sde_steps=traj.sde_steps,
        cond=t.model.encode_prompts([q for x in parts for q in x[0]]),
    )
    policy_update(t.model, whole, torch.cat([x[3] for x in parts]), t.update, t.sampler)
    single = flat_grad(t.params)
    return {
        "batch": whole.batch_size,
        "norm": float(single.norm()),
        "max_abs_diff": float((averaged - single).abs().max()),
        "local_max_abs_diff": float((local - single).abs().max()),
    }


def routing(acc: Accelerator, runs_dir: Path) -> dict:
    cfg = load_config(None, [*SMALL, "window=3", "auto_route=true", "auto_route_every=1", "steps=2"])
    run_id = None
    if acc.is_main_process:
        store = open_store(runs_dir)
        run_id = store.create_run("route", cfg.to_dict(), runs_dir / "route")
    box = [run_id]
    broadcast_object_list(box, from_process=0)
    run_id = box[0]
    t = Trainer(cfg, run_id, str(runs_dir), accelerator=acc, run_dir=runs_dir / "route")
    prompts, groups = t.step_prompts(1)
    traj = t.sample(1, prompts)
    total, _, _ = t.score(traj, prompts)
    adv, _ = t.advantages(total, groups)
    n = min(16, traj.batch_size)  # what route() probes
    rows, _ = probe_groups(t.model, t.params, traj.select(slice(0, n)), adv[:n], t.update, t.sampler)
    own = [r.cosine for r in rows]  # this rank's own cosines, not reduced
    cosines = gather_object([own])
    threshold = (cosines[0][0] + cosines[1][0]) / 2
    t.cfg = dataclasses.replace(cfg, auto_route_threshold=threshold)
    own_fracs = gather_object([auto_jagg_frac(own, threshold)])

    used: list[tuple[int, float]] = []
    real = trainer_mod.policy_update

    def recording(model, traj, advantages, update, sampler, *args, **kw):
        used.append(update.jagg_frac)
        return real(model, traj, advantages, update, sampler, *args, **kw)

    trainer_mod.policy_update = recording
    try:
        status = t.run()
    finally:
        trainer_mod.policy_update = real
    per_rank = gather_object([used])
    if not acc.is_main_process:
        return {}
    frame = open_store(runs_dir).metrics_frame(run_id)
    logged = frame.loc[frame.step > 0, "route/jagg_frac"].tolist()
    return {
        "status": status,
        "cosines": cosines,
        "threshold": threshold,
        "own_fracs": own_fracs,
        "used": per_rank,
        "logged": logged,
        "probe_steps": sorted({p["step"] for p in open_store(runs_dir).probes(run_id)}),
    }


def main() -> None:
    out = Path(sys.argv[1])
    acc = Accelerator(cpu=True)
    runs_dir = out.parent / "runs"
    result = {s: gradients(acc, runs_dir, s) for s in ("exact", "jagg")}
    result["routing"] = routing(acc, runs_dir)
    if acc.is_main_process:
        result["world"] = acc.num_processes
        out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()

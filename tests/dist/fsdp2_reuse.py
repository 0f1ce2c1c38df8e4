"""Run under torchrun (2 processes, gloo): FSDP2 parameters (DTensor shards) stepped by AdamW with foreach
forced — the default on CUDA; the CPU's default is single-tensor — leave the version counters as they were. The
velocity-reuse guard must still see the step: no velocity reused, and a gradient bit-equal to reuse off.
Rank 0 writes what it measured to the JSON file in argv[1]."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from jagg_engine.backbones.flux_core import TinyFlux
from jagg_engine.jagg import UpdateConfig, policy_update
from jagg_engine.sde import SamplerConfig, rollout


def gradient(model, traj, adv, update, sampler):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(7)
    result = policy_update(model, traj, adv, update, sampler)
    grads = [p.grad.full_tensor() for p in model.parameters() if p.grad is not None]
    return result, torch.cat([g.flatten() for g in grads])


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sampler = SamplerConfig(num_steps=8, shift=3.0)
    torch.manual_seed(0)
    model = TinyFlux(seed=0)
    tf = model.velocity.transformer
    for block in [*tf.transformer_blocks, *tf.single_transformer_blocks]:
        fully_shard(block)
    fully_shard(tf)
    g = torch.Generator().manual_seed(1 + rank)
    cond = model.encode_prompts([f"p{i}" for i in range(2)])
    noise = torch.randn(2, *model.latent_shape, generator=g)
    traj = rollout(model, cond, noise, sampler, generator=g, store_velocities=True)
    traj.log_probs = traj.log_probs + 0.01 * torch.randn(traj.log_probs.shape, generator=g)
    adv = torch.randn(2, generator=g)
    auto = UpdateConfig(window=4, clip_range=1e-2, reuse_rollout_velocity="auto")
    off = UpdateConfig(window=4, clip_range=1e-2, reuse_rollout_velocity="off")

    fresh, _ = gradient(model, traj, adv, auto, sampler)  # the sampling policy: reuse happens
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    before = [p._version for p in params]
    optimizer.step()
    unchanged_versions = [p._version for p in params] == before
    stale, g_auto = gradient(model, traj, adv, auto, sampler)
    plain, g_off = gradient(model, traj, adv, off, sampler)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(
                {
                    "dtensor": type(params[0]).__name__,
                    "reused_before_step": fresh.counts.reused,
                    "versions_unchanged_by_step": unchanged_versions,
                    "reused_after_step": stale.counts.reused,
                    "forward_nograd_after_step": stale.counts.forward_nograd,
                    "forward_nograd_off": plain.counts.forward_nograd,
                    "bit_equal": bool(torch.equal(g_auto, g_off)),
                },
                f,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

"""Run under torchrun (2 processes, gloo): the JAGG joint backward under raw FSDP2 (fully_shard) must give the
gradient of one process on the whole batch. Rank 0 writes the max relative error to the file in argv[1]."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from jagg_engine.backbones.flux_core import TinyFlux
from jagg_engine.jagg import UpdateConfig, policy_update
from jagg_engine.sde import SamplerConfig, rollout


def make_model():
    torch.manual_seed(0)
    return TinyFlux(seed=0)


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = SamplerConfig(num_steps=8, shift=3.0)
    update = UpdateConfig(strategy="jagg", window=4, clip_range=1e-2)

    # the same rollout batch and advantages on every rank (same seeds)
    ref = make_model()
    g = torch.Generator().manual_seed(1)
    cond = ref.encode_prompts([f"p{i}" for i in range(4)])
    traj = rollout(ref, cond, torch.randn(4, *ref.latent_shape, generator=g), sampler, generator=g)
    traj.log_probs = traj.log_probs + 0.01 * torch.randn(traj.log_probs.shape, generator=g)
    adv = torch.randn(4, generator=g)

    # single process, whole batch
    policy_update(ref, traj, adv, update, sampler)
    expected = {n: p.grad.clone() for n, p in ref.velocity.transformer.named_parameters()}

    # FSDP2: every transformer block sharded, then the root; each rank its half of the batch
    model = make_model()
    tf = model.velocity.transformer
    for block in [*tf.transformer_blocks, *tf.single_transformer_blocks]:
        fully_shard(block)
    fully_shard(tf)
    half = traj.batch_size // world
    mine = slice(rank * half, (rank + 1) * half)
    policy_update(model, traj.select(mine), adv[mine], update, sampler)
    worst = 0.0
    for n, p in tf.named_parameters():
        full = p.grad.full_tensor()  # reduce-scattered mean over ranks = the whole-batch mean
        err = ((full - expected[n]).norm() / expected[n].norm().clamp_min(1e-12)).item()
        worst = max(worst, err)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"max_rel_error": worst, "params": len(expected)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

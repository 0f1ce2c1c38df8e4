"""What a training step is built from, as functions of the config, the step and the rank: the model and
its sharding (:func:`build_model`, :func:`shard_fsdp2`), the sampler of a step (:func:`sampler_config` on the
σ grid of :func:`pipeline_schedule`), the prompts of a step and rank (:func:`rank_prompts`, read in epochs by
:func:`epoch_prompt_indices`), the update's mini-batches (:func:`minibatch_indices`) and the data-parallel
gradient average (:func:`average_gradients`). :class:`jagg_engine.train.trainer.Trainer` calls them; the
eval, the sample command and the studies call the same ones, so each reads the run as the trainer does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from jagg_engine.backbones import build_backbone, get_backbone
from jagg_engine.plugins import resolve
from jagg_engine.sde import SamplerConfig
from jagg_engine.streams import numpy_stream
from jagg_engine.train.config import TrainConfig, read_prompts


class TrainingError(RuntimeError):
    """A run cannot go on (non-finite loss or reward, …); the message is stored as the run's error."""


def shard_fsdp2(model: Any) -> None:
    """FSDP2: ``fully_shard`` every transformer block, then the transformer (one all-gather per block).

    Under JAGG the joint endpoint backward runs each block's backward once for both endpoints, so a group
    costs one all-gather and one reduce-scatter per block instead of W.
    """
    from torch.distributed.fsdp import fully_shard

    tf = getattr(model, "transformer", None)
    if tf is None:
        tf = getattr(getattr(model, "velocity", None), "transformer", None)
    if tf is None:
        raise TrainingError(
            f"fsdp: backbone {getattr(model, 'name', model)!r} exposes no transformer to shard"
        )
    for block in [*getattr(tf, "transformer_blocks", []), *getattr(tf, "single_transformer_blocks", [])]:
        fully_shard(block)
    fully_shard(tf)


def average_gradients(params: list[torch.nn.Parameter], world: int, bucket_bytes: int = 1 << 28) -> None:
    """Data parallelism without a wrapper: replace every ``.grad`` by its mean over the ``world`` ranks.

    The gradients are packed into flat buckets (one dtype and device each, at most ``bucket_bytes``) and each
    bucket is one all-reduce, as DDP does, but once after the whole update rather than from backward hooks:
    a JAGG update makes several ``autograd.backward`` calls through backbone methods that are not the
    module's ``forward``, which DDP's reducer does not follow. A parameter with no ``.grad`` on any rank keeps
    ``None``, as under DDP (so AdamW leaves it alone: no weight decay on a weight that nothing used); one with a
    gradient on some ranks only counts as zeros on the others.
    """
    import torch.distributed as dist

    has = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)  # (P,)
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    used = [p for p, h in zip(params, has.tolist()) if h]
    for p in used:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    params = used
    buckets: dict[tuple[torch.dtype, torch.device], list[list[torch.nn.Parameter]]] = {}
    filled: dict[tuple[torch.dtype, torch.device], int] = {}
    for p in params:
        key, size = (p.grad.dtype, p.grad.device), p.grad.numel() * p.grad.element_size()
        chunks = buckets.setdefault(key, [[]])
        if chunks[-1] and filled[key] + size > bucket_bytes:
            chunks.append([])
            filled[key] = 0
        chunks[-1].append(p)
        filled[key] = filled.get(key, 0) + size
    for chunks in buckets.values():
        for bucket in chunks:
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])  # (Σ numel,)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(world)
            offset = 0
            for p in bucket:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n


def build_model(cfg: TrainConfig, device: torch.device) -> Any:
    """The backbone of ``cfg`` with the options its factory takes (:meth:`TrainConfig.backbone_kwargs`)."""
    opts = cfg.backbone_kwargs(device=str(device))
    model = build_backbone(cfg.backbone, **opts)
    if isinstance(model, torch.nn.Module):
        model.to(device).eval()  # no dropout: the update must see the function that sampled
    return model


def pipeline_schedule(cfg: TrainConfig, model: Any) -> tuple[float, ...] | None:
    """Under ``schedule: pipeline`` the σ grid of the backbone's diffusers pipeline for ``sampling_steps`` steps
    at the size it trains (``model.pipeline_sigmas``, T + 1 values); None under shifted-linear."""
    if cfg.resolved_schedule() != "pipeline":
        return None
    return tuple(float(s) for s in model.pipeline_sigmas(cfg.sampling_steps))


def sampler_config(
    cfg: TrainConfig, schedule: tuple[float, ...] | None, step: int | None = None
) -> SamplerConfig:
    """The sampler of training step ``step`` (None = the first), the one builder the rollout, the update, the
    probe and the eval read: ``cfg.sampler_config(step)`` (its SDE window at that step) on the σ grid
    ``schedule`` (:func:`pipeline_schedule`; None keeps the shifted-linear grid). Under a pipeline grid the
    re-spaced ODE parts (ode_steps_before / ode_steps_after) interpolate the pipeline's σ linearly over its
    step index (:func:`jagg_engine.sde.respace` at shift 1, the shift a pipeline schedule requires)."""
    sampler = cfg.sampler_config(step)
    return sampler if schedule is None else dataclasses.replace(sampler, schedule=schedule)


def window_sigmas(sampler: SamplerConfig) -> tuple[float, float]:
    """σ at the SDE window's first step and after its last step, on the grid the rollout walks."""
    grid = sampler.grid()
    if not grid.sde_steps:
        return math.nan, math.nan
    return float(grid.sigmas[grid.sde_steps[0]]), float(grid.sigmas[grid.sde_steps[-1] + 1])


def prompt_source(cfg: TrainConfig, eval_set: bool = False) -> list[str]:
    """The prompt list of ``cfg``: its ``eval_prompts_file`` (``eval_set``, when it has one) or ``prompts_file``,
    else the backbone's procedural prompts (its registry entry's ``prompts``), else ``prompt 0``, ``prompt 1``, …"""
    path = cfg.eval_prompts_file if eval_set and cfg.eval_prompts_file else cfg.prompts_file
    if path:
        return read_prompts(path)
    procedural = get_backbone(cfg.backbone).prompts  # the registry entry's prompt list, if it has one
    if procedural is not None:
        return list(resolve(procedural)())
    return [f"prompt {i}" for i in range(max(cfg.eval_num_prompts, cfg.prompts_per_step))]


def epoch_prompt_indices(seed: int, step: int, n_prompts: int, per_step: int) -> np.ndarray:
    """Indices of step ``step``'s prompts (steps count from 1): the prompt list is read in epochs, each one a
    fresh permutation from the "prompts" stream of (seed, epoch), ``per_step`` prompts a step. Every prompt
    comes once per epoch, so windows of whole epochs see the same prompt mix (the training-reward curve is not
    a prompt lottery), and the order depends only on (seed, step): a resumed run sees the same prompts. Same
    on every rank."""
    start = (step - 1) * per_step
    out = np.empty(per_step, dtype=np.int64)
    perms: dict[int, np.ndarray] = {}
    for i, pos in enumerate(range(start, start + per_step)):
        epoch, k = divmod(pos, n_prompts)
        if epoch not in perms:
            perms[epoch] = numpy_stream(seed, epoch, 0, "prompts").permutation(n_prompts)
        out[i] = perms[epoch][k]
    return out


def minibatch_indices(cfg: TrainConfig, step: int, rank: int, n: int) -> list[torch.Tensor | None]:
    """The samples of each of the ``updates_per_rollout`` mini-batches of a rank's ``n`` samples: slices of a
    permutation from the "minibatch" stream of (seed, step, rank), as Flow-GRPO shuffles before splitting;
    ``[None]`` (the whole batch, in order) when there is one."""
    m = cfg.updates_per_rollout
    if m == 1:
        return [None]
    perm = torch.from_numpy(numpy_stream(cfg.seed, step, rank, "minibatch").permutation(n))
    return list(perm.reshape(m, n // m))  # (M, n / M)


def rank_prompts(
    cfg: TrainConfig, prompts: list[str], step: int, rank: int = 0, world: int = 1
) -> tuple[list[str], torch.Tensor]:
    """Rank ``rank``'s prompts of step ``step`` (of ``world`` ranks), each repeated group_size times, and their
    global group ids: (B,), B = P·G with P = prompts_per_step / world."""
    idx = epoch_prompt_indices(cfg.seed, step, len(prompts), cfg.prompts_per_step)
    per_rank = cfg.prompts_per_step // world
    mine = range(rank * per_rank, (rank + 1) * per_rank)
    return (
        [prompts[idx[i]] for i in mine for _ in range(cfg.group_size)],
        torch.tensor([i for i in mine for _ in range(cfg.group_size)]),
    )

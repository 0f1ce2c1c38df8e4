"""The one protocol every backbone adapter implements, and the conditioning helpers the engine relies on.

The engine (``jagg_engine.sde``, ``jagg_engine.jagg``) only ever sees a *velocity callable*
``v(z, t, cond) -> v̂`` with

    z    : (B, *latent_shape)   the noisy latent at time t (flow matching: z_t = (1 − t)·x0 + t·ε)
    t    : (B,)                 the flow time σ ∈ [0, 1] (1 = pure noise), one per sample
    cond : pytree               conditioning; every tensor leaf has the batch dimension first (B, ...)
    v̂   : (B, *latent_shape)   the predicted velocity ε − x0

Backbone adapters keep anything without a batch dimension (position ids, image shapes) as their own
attributes, so the engine can batch two calls by concatenating ``z``, ``t`` and every tensor leaf of ``cond``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

Cond = Any  # a pytree (tensor / dict / list / tuple / None) whose tensor leaves are batch-first
VelocityFn = Callable[[torch.Tensor, torch.Tensor, Cond], torch.Tensor]


@runtime_checkable
class Backbone(Protocol):
    """What the engine and the trainer need from a text-to-image flow-matching model.

    ``__call__`` is the velocity callable described in the module docstring. ``encode_prompts`` turns
    prompts into the batch-first ``cond`` pytree; ``decode`` turns final latents into uint8 images
    (B, H, W, 3); ``latent_shape`` is the per-sample latent shape; ``trainable_parameters`` lists what the
    optimizer updates (LoRA weights or all weights).
    """

    name: str
    latent_shape: tuple[int, ...]

    def __call__(self, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> torch.Tensor: ...

    def encode_prompts(self, prompts: Sequence[str]) -> Cond: ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor: ...

    def trainable_parameters(self) -> list[torch.nn.Parameter]: ...


def cat_cond(conds: Sequence[Cond]) -> Cond:
    """Concatenate several batch-first conditioning pytrees along the batch dimension.

    Tensors are concatenated on dim 0; dicts, lists and tuples recursively; anything else (None, a string,
    a number) must be equal across the inputs and is passed through.
    """
    first = conds[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(conds), dim=0)
    if isinstance(first, dict):
        return {k: cat_cond([c[k] for c in conds]) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(cat_cond([c[i] for c in conds]) for i in range(len(first)))
    return first


def index_cond(cond: Cond, index: torch.Tensor | slice) -> Cond:
    """Select samples ``index`` (a slice or a 1-D index tensor) from every tensor leaf of ``cond``."""
    if isinstance(cond, torch.Tensor):
        return cond[index]
    if isinstance(cond, dict):
        return {k: index_cond(v, index) for k, v in cond.items()}
    if isinstance(cond, (list, tuple)):
        return type(cond)(index_cond(v, index) for v in cond)
    return cond


def default_prompts(backbone: Any, n: int, seed: int) -> list[str]:
    """``n`` prompts ``backbone`` can encode, for tools that need a batch but no prompt set (probe, bench,
    study): its own ``sample_prompts(n, seed)`` when it has one, otherwise generic text."""
    sample = getattr(backbone, "sample_prompts", None)
    if sample is not None:
        return list(sample(n, seed))
    return [f"prompt {i}" for i in range(n)]


def hashed_prompt_embeddings(
    prompts: Sequence[str], text_len: int, dim: int, pooled_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random text embeddings for models built without a text encoder (tiny and benchmark models).

    Each prompt seeds a CPU generator with Σ_i ord(c_i)·(i + 1) mod 2³¹ over its characters (the same on
    every machine and process, unlike Python's ``hash``), then draws its sequence and its pooled embedding.
    Returns float32 CPU tensors (B, text_len, dim) and (B, pooled_dim).
    """
    embeds, pooled = [], []
    for p in prompts:
        g = torch.Generator().manual_seed(sum(ord(c) * (i + 1) for i, c in enumerate(p)) % (2**31))
        embeds.append(torch.randn(text_len, dim, generator=g))
        pooled.append(torch.randn(pooled_dim, generator=g))
    return torch.stack(embeds), torch.stack(pooled)

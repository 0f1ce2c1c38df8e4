"""One registry for reward models: (images, prompts) → scores, and weighted sums of several.

A reward is any object with ``__call__(images, prompts) -> scores`` where

    images  : (B, H, W, 3) uint8 tensor on the CPU (what ``Backbone.decode`` returns)
    prompts : list of B strings
    scores  : (B,) float32 tensor, higher is better

Factories are registered by name with :func:`register_reward`, in the module that defines them: every module of
the ``jagg_engine.rewards`` package is imported the first time a name is looked up, so a new reward is one new
file in this folder (a reward in a user's own module is registered when the config's ``plugins`` imports it).
:func:`check_reward` validates a name and its options (optional dependency installed, weight files present)
*before* any training starts, and :func:`build_reward` constructs it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class Reward(Protocol):
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor: ...


class RewardConfigError(ValueError):
    """A reward name, option, missing dependency or missing weight file; the message is one line."""


@dataclass(frozen=True)
class RewardSpec:
    factory: Callable[..., Reward]
    check: Callable[..., None] | None = None  # raises RewardConfigError; must not load weights
    help: str = ""


_REGISTRY: dict[str, RewardSpec] = {}
_LOADED = False


def register_reward(
    name: str, *, check: Callable[..., None] | None = None, help: str = ""
) -> Callable[[Callable[..., Reward]], Callable[..., Reward]]:
    """Decorator: register ``factory(**options) -> Reward`` under ``name``."""

    def deco(factory: Callable[..., Reward]) -> Callable[..., Reward]:
        _REGISTRY[name] = RewardSpec(factory=factory, check=check, help=help)
        return factory

    return deco


def _load_builtin_rewards() -> None:
    """Import every module of the ``jagg_engine.rewards`` package (once): importing a module registers its
    rewards, so a new reward is one new file here, with no list to edit. Kept lazy so that importing the
    registry is cheap; a reward module imports its optional dependencies inside its functions, so a missing
    one is reported by :func:`check_reward`, not here."""
    global _LOADED
    if _LOADED:
        return
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "registry" and not module.name.startswith("_"):
            importlib.import_module(f"{__package__}.{module.name}")
    _LOADED = True


def available_rewards() -> list[str]:
    _load_builtin_rewards()
    return sorted(_REGISTRY)


def check_reward(name: str, **options: Any) -> None:
    """Validate a reward name and its options without loading any model; raises RewardConfigError."""
    _load_builtin_rewards()
    if name not in _REGISTRY:
        raise RewardConfigError(f"reward: unknown reward {name!r}; allowed: {', '.join(sorted(_REGISTRY))}")
    spec = _REGISTRY[name]
    if spec.check is not None:
        spec.check(**options)


def build_reward(name: str, **options: Any) -> Reward:
    check_reward(name, **options)
    return _REGISTRY[name].factory(**options)


class WeightedReward:
    """Σ_k w_k · reward_k(images, prompts); also returns each component for logging."""

    def __init__(self, weights: Mapping[str, float], options: Mapping[str, Mapping[str, Any]] | None = None):
        if not weights:
            raise RewardConfigError("reward: at least one reward is needed")
        options = options or {}
        self.weights = dict(weights)
        self.rewards = {name: build_reward(name, **options.get(name, {})) for name in self.weights}

    def bind(self, **context: Any) -> None:
        """Hand the run's context (store, run id, folder, group size, steps) to the rewards that take one
        (``picks``: it asks the run's person); the others have no ``bind``."""
        for reward in self.rewards.values():
            if hasattr(reward, "bind"):
                reward.bind(**context)

    def set_step(self, step: int | None) -> None:
        """The training step the next call scores (None: an eval), for the rewards that ask per step."""
        for reward in self.rewards.values():
            if hasattr(reward, "set_step"):
                reward.set_step(step)

    def step_metrics(self) -> dict[str, float]:
        """Metrics of the last training call from the rewards that keep some (``picks/…``)."""
        out: dict[str, float] = {}
        for reward in self.rewards.values():
            if hasattr(reward, "step_metrics"):
                out.update(reward.step_metrics())
        return out

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        parts = {name: r(images, prompts).float().cpu() for name, r in self.rewards.items()}
        total = sum(self.weights[name] * s for name, s in parts.items())
        return total, parts

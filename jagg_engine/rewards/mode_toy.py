"""The `mode-toy` reward: closeness of a `mode-toy` point to its prompt's mode 0.

r = exp(−‖x − μ_{k,0}‖² / (2·τ²)) in (0, 1], x read back from the toy's fixed-point strip
(:func:`jagg_engine.backbones.mode_toy.decode_points`), k the prompt's index. ``tau`` (default 0.5) sets how
much precision inside the mode pays: samples of the pretrained model in mode 0 score ≈ 0.24, in another mode
≈ 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .registry import RewardConfigError, register_reward


def _check(tau: float = 0.5) -> None:
    if not isinstance(tau, (int, float)) or not tau > 0:
        raise RewardConfigError(f"reward.tau: must be a number > 0, got {tau!r}")


class ModeToyReward:
    def __init__(self, tau: float = 0.5):
        self.tau = float(tau)

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        from ..backbones.mode_toy import centres, decode_points, prompt_index

        x = decode_points(images)
        target = centres()[prompt_index(prompts), 0]
        return torch.exp(-(x - target).pow(2).sum(-1) / (2 * self.tau**2))


@register_reward("mode-toy", check=_check, help="mode-toy: exp(−‖x − prompt's mode 0‖² / 2τ²); option tau")
def mode_toy(tau: float = 0.5) -> ModeToyReward:
    return ModeToyReward(tau)

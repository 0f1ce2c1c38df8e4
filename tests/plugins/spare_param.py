"""A test backbone: linear-toy plus a parameter that no forward uses (``spare``), registered as
"linear-toy-spare". Import this module (or name it in the config's ``plugins``) to register it."""

import torch

from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.backbones.registry import register_backbone


class SpareToy(LinearToy):
    name = "linear-toy-spare"

    def __init__(self, dim: int = 16, seed: int = 0):
        super().__init__(dim=dim, seed=seed)
        g = torch.Generator().manual_seed(seed + 1)
        self.spare = torch.nn.Parameter(torch.randn(dim, generator=g, dtype=torch.float64))


register_backbone(
    "linear-toy-spare", SpareToy, procedural_prompts=True, help="linear-toy + an unused parameter"
)

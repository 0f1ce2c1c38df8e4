"""Where and in what precision a command runs when the user does not say. Pure torch.

One rule for every entry point (backbones, rewards, `jagg eval`, `jagg bench`): the current CUDA device when
there is one, else the CPU; bfloat16 weights on a GPU, float32 on the CPU.
"""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``None``, ``""`` or ``"auto"`` → ``cuda`` when a CUDA device is available, else ``cpu``; anything
    else as :class:`torch.device` reads it (``"cuda:1"``, ``"cpu"``)."""
    if device is None or (isinstance(device, str) and device in ("", "auto")):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def default_dtype(device: torch.device) -> torch.dtype:
    """The weights' dtype when none is given: bfloat16 on a GPU, float32 on the CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32

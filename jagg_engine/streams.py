"""Independent random streams: every random draw of a training step has its own stream.

A stream is named by (seed, index, rank, purpose): ``index`` is the training step (or, for the prompt order,
the epoch), ``rank`` the process, ``purpose`` what the stream feeds (:data:`PURPOSES`). Its seed is derived by
numpy's ``SeedSequence`` from those four integers, so two streams that differ in any of them start from
unrelated states on any device: the SDE noise is never a copy of the initial noise (which is what two
generators seeded alike on one device give), the same after a resume, and a new purpose added later changes
no existing stream. README "Random streams" lists which stream feeds what.

Pure: numpy and torch only.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

# Each purpose's code is the CRC-32 of its name: fixed, so adding a purpose moves no other stream.
PURPOSES = ("init_noise", "sde_noise", "prompts", "minibatch", "window", "control_variate", "pair")
_CODES = {p: zlib.crc32(p.encode()) for p in PURPOSES}


def stream_seed(seed: int, index: int, rank: int, purpose: str) -> int:
    """The 64-bit seed of stream (seed, index, rank, purpose), from ``np.random.SeedSequence``. Refuses, naming
    the field, a purpose not in :data:`PURPOSES` and a seed, index or rank that is not an integer >= 0 (a float
    is not rounded into another stream's)."""
    if not isinstance(purpose, str) or purpose not in _CODES:
        raise ValueError(f"purpose: must be one of {', '.join(PURPOSES)}, got {purpose!r}")
    for name, value in (("seed", seed), ("index", index), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")
    entropy = [int(seed), int(index), int(rank), _CODES[purpose]]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0])


def torch_stream(
    seed: int, index: int, rank: int, purpose: str, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A torch generator on ``device`` for stream (seed, index, rank, purpose)."""
    return torch.Generator(device=device).manual_seed(stream_seed(seed, index, rank, purpose))


def numpy_stream(seed: int, index: int, rank: int, purpose: str) -> np.random.Generator:
    """A numpy generator for stream (seed, index, rank, purpose)."""
    return np.random.default_rng(stream_seed(seed, index, rank, purpose))

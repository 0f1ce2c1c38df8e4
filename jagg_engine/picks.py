"""The voter side of a ``picks`` run: the groups waiting for a vote, casting one, and a scripted person.

A ``picks`` run (:mod:`jagg_engine.rewards.picks`) writes each group it asks about as PNGs in its folder
(``picks/step_NNNNN/gGG_K.png``) and a pending row of the store's ``pick_groups``; it waits for votes in the
store's ``votes`` table. Anyone who can open the runs folder votes through :func:`pending_groups` and
:func:`cast_vote` (the studio's Vote view does, and so does :class:`ScriptedPerson`); the store refuses a vote
it must not take (:meth:`jagg_engine.store.RunStore.cast_vote`), in one line.

The scripted person has a hidden taste, a score computed from the image that the run is never told:

    big   the share of the image's pixels that are foreground (max channel ≥ 64): "prefers one big shape"
    red   the mean over pixels of clip((R − max(G, B)) / 255, 0, 1): "prefers red shapes"
    small 1 − big: "prefers one small shape". Training on tiny-shapes grows the shapes whatever the reward
          (a run on random votes raises ``big``), so a rise of ``small`` is what the votes bought, not drift.

It picks the best of each pending group by its taste (ties: the lowest index), so a run that learns its picks
raises the taste's score. The same scores are the ``taste`` reward (the benchmark's ceiling: a run trained on
the hidden score directly).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from jagg_engine.store import RunStore

FOREGROUND = 64  # max channel (0–255) for a pixel to count as drawn


def taste_big(images: torch.Tensor) -> torch.Tensor:
    """Share of foreground pixels. uint8 (B, H, W, 3) → (B,) float32 in [0, 1]."""
    return (images.amax(dim=-1) >= FOREGROUND).float().mean(dim=(1, 2))


def taste_red(images: torch.Tensor) -> torch.Tensor:
    """Mean redness clip((R − max(G, B)) / 255, 0, 1). uint8 (B, H, W, 3) → (B,) float32 in [0, 1]."""
    x = images.float() / 255.0
    return (x[..., 0] - x[..., 1:].amax(dim=-1)).clamp(0, 1).mean(dim=(1, 2))


def taste_small(images: torch.Tensor) -> torch.Tensor:
    """Share of background pixels (1 − :func:`taste_big`). uint8 (B, H, W, 3) → (B,) float32 in [0, 1]."""
    return 1.0 - taste_big(images)


TASTES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "big": taste_big,
    "red": taste_red,
    "small": taste_small,
}


def check_taste(taste: str) -> None:
    if taste not in TASTES:
        raise ValueError(f"taste: must be one of {', '.join(TASTES)}, got {taste!r}")


def load_images(run_dir: str | Path, paths: list[str]) -> torch.Tensor:
    """The PNGs of a group, relative to the run folder → uint8 (G, H, W, 3)."""
    arrays = [np.asarray(Image.open(Path(run_dir) / p).convert("RGB")) for p in paths]
    return torch.from_numpy(np.stack(arrays))


def pending_groups(store: RunStore, run_id: int | None = None) -> list[dict[str, Any]]:
    """Groups waiting for a vote (one run's, or every run's), oldest first; ``paths`` relative to the run folder."""
    return store.pick_groups(run_id, "pending")


def cast_vote(
    store: RunStore, run_id: int, step: int, group_index: int, sample: int | None, choice: str, voter: str
) -> dict[str, Any]:
    """One vote, committed before it returns (:meth:`RunStore.cast_vote`; refusals raise StoreError)."""
    return store.cast_vote(run_id, step, group_index, sample, choice, voter)


class ScriptedPerson:
    """Votes "best" on every pending group of a run by a hidden taste (see the module's docstring)."""

    def __init__(self, store: RunStore, run_id: int, taste: str = "big", voter: str = "owner"):
        check_taste(taste)
        self.store, self.run_id, self.taste, self.voter = store, run_id, taste, voter
        self.cast = 0
        self.seconds = 0.0  # time spent reading groups and casting votes (the API's cost per vote)

    def vote_pending(self) -> int:
        """Vote on every group pending now; returns how many votes were cast."""
        from jagg_engine.store import StoreError

        row = self.store.get_run(self.run_id)
        if row is None:
            return 0
        n = 0
        for group in pending_groups(self.store, self.run_id):
            started = time.perf_counter()
            images = load_images(row["run_dir"], group["paths"])
            best = int(TASTES[self.taste](images).argmax())
            try:
                cast_vote(
                    self.store, self.run_id, group["step"], group["group_index"], best, "best", self.voter
                )
            except StoreError:
                continue  # voted already, closed meanwhile, the run ended: nothing to do
            self.seconds += time.perf_counter() - started
            n += 1
        self.cast += n
        return n

    def run(self, stop: threading.Event, poll_s: float = 0.2) -> None:
        """Vote until ``stop`` is set (in a thread beside the trainer)."""
        while not stop.is_set():
            self.vote_pending()
            stop.wait(poll_s)

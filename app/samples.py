"""A run's sample images step by step: what the Live tab's step slider shows.

Eval images are the fixed eval prompts × eval seeds, so the same place in the gallery is the same prompt and
seed at every step, and moving the slider shows that sample changing as the policy trains. Train images are
the first sample of a few groups of that step's rollout (their prompts change from step to step).
"""

from __future__ import annotations

import os
from typing import Any

from app.data import RunImages, _caption
from jagg_engine.store import RunStore

KINDS = ("eval", "train")


def sample_steps(store: RunStore, run_id: int, kind: str = "eval") -> list[int]:
    """The steps at which the run logged ``kind`` images, ascending."""
    return sorted({s["step"] for s in store.samples(run_id, kind)})


def nearest_step(steps: list[int], wanted: float | None) -> int | None:
    """The logged step closest to ``wanted`` (the later one on a tie; the last one for None)."""
    if not steps:
        return None
    if wanted is None:
        return steps[-1]
    return min(reversed(steps), key=lambda s: abs(s - float(wanted)))


def step_gallery(
    store: RunStore,
    run_id: int,
    runs_root: str | os.PathLike[str],
    kind: str = "eval",
    step: float | None = None,
    limit: int = 48,
) -> tuple[int | None, list[tuple[str, str]]]:
    """(the step shown, its (image path, caption) items ordered by prompt then seed) for the logged step
    nearest ``step``. Images outside the runs folder, or gone from disk, are left out."""
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    run = store.get_run(run_id)
    if run is None:
        return None, []
    samples = store.samples(run_id, kind)
    shown = nearest_step(sorted({s["step"] for s in samples}), step)
    images = RunImages(run["run_dir"], runs_root)
    rows = sorted(
        (s for s in samples if s["step"] == shown),
        key=lambda s: (s.get("prompt") or "", s.get("seed") or 0, s["path"]),
    )
    items: list[tuple[str, str]] = []
    for s in rows[:limit]:
        path = images.path(s["path"])
        if path is not None:
            items.append((path, _caption(s)))
    return shown, items


def steps_note(kind: str, shown: int | None, steps: list[int]) -> str:
    """``eval images at step 3 (logged at steps 0, 3, 6)``."""
    if shown is None:
        return f"No {kind} images logged yet."
    listed = ", ".join(map(str, steps[:20])) + (" …" if len(steps) > 20 else "")
    return f"{kind.capitalize()} images at step **{shown}** (logged at steps {listed})."


def slider_range(store: RunStore, run_id: int | None) -> dict[str, Any]:
    """The step slider's bounds for a run: 0 to the last step with images of any kind (at least 1)."""
    last = store.sample_count(run_id)[1] if run_id is not None else None
    return {"minimum": 0, "maximum": max(1, int(last or 0))}

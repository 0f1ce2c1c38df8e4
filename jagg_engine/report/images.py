"""A run's sample images: paths kept inside the run folder, and the eval images of the same prompts and
seeds side by side at each run's own first and last eval step."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jagg_engine.store import RunStore

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def safe_image_path(
    run_dir: str | os.PathLike[str] | None, rel: str, runs_root: str | os.PathLike[str]
) -> str | None:
    """The absolute path of a sample image if it resolves (symlinks followed) to an existing image file
    inside ``runs_root``; None otherwise. The gallery shows nothing else."""
    if not run_dir:
        return None
    root = Path(runs_root).resolve()
    path = (Path(run_dir) / rel).resolve()
    if not path.is_relative_to(root) or path == root:
        return None
    if path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
        return None
    return str(path)


class RunImages:
    """Finds a run's sample images by listing each of its folders once.

    A gallery asks for up to a few hundred relative paths; looking each one up costs a failed ``stat`` per
    missing file and a ``resolve`` per present one. Here a folder that is gone (the run folder, or a step's
    samples folder) is one failed listing and every image in it is skipped at once; only names that the
    listing holds go through :func:`safe_image_path` (symlinks followed, must stay inside the runs root).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None, runs_root: str | os.PathLike[str]):
        self.run_dir = Path(run_dir) if run_dir else None
        self.runs_root = runs_root
        self.exists = self.run_dir is not None and self.run_dir.is_dir()
        self._listings: dict[str, frozenset[str]] = {}

    def path(self, rel: str) -> str | None:
        """The absolute path of the image ``rel`` (relative to the run folder) if it is there and safe."""
        if not self.exists:
            return None
        parent, name = os.path.split(rel)
        names = self._listings.get(parent)
        if names is None:
            try:
                with os.scandir(self.run_dir / parent) as entries:
                    names = frozenset(e.name for e in entries)
            except OSError:
                names = frozenset()
            self._listings[parent] = names
        if name not in names:
            return None
        return safe_image_path(self.run_dir, rel, self.runs_root)


def _caption(sample: Mapping[str, Any], with_step: bool = True) -> str:
    parts = [f"step {sample['step']}"] if with_step else []
    parts.append(sample.get("prompt") or "")
    if sample.get("seed") is not None:
        parts.append(f"seed {sample['seed']}")
    if sample.get("reward") is not None:
        parts.append(f"reward {float(sample['reward']):.3f}")
    return " · ".join(p for p in parts if p)


def _eval_images(
    runs: Sequence[Mapping[str, Any]],
    samples: Mapping[int, Sequence[Mapping[str, Any]]],
    runs_root: str | os.PathLike[str],
    wanted: Mapping[int, set[int]],
) -> dict[tuple[int, int], dict[tuple[str, int], tuple[str, str]]]:
    """(run id, step) → (prompt, seed) → (image path, caption) of each run's eval samples at its ``wanted``
    steps whose image file is there."""
    found: dict[tuple[int, int], dict[tuple[str, int], tuple[str, str]]] = {}
    for run in runs:
        images = RunImages(run["run_dir"], runs_root)  # a missing folder: its images skipped at once
        for s in samples[run["id"]]:
            if s["step"] not in wanted[run["id"]]:
                continue
            path = images.path(s["path"])
            if path is not None:
                found.setdefault((run["id"], s["step"]), {})[(s.get("prompt") or "", s.get("seed") or 0)] = (
                    path,
                    f"#{run['id']} {run['config'].get('strategy')} · " + _caption(s),
                )
    return found


def own_step_cells(
    store: RunStore,
    run_ids: Sequence[int],
    runs_root: str | os.PathLike[str],
    at: float | None = None,
    limit_keys: int = 8,
) -> tuple[list[tuple[str, str]], list[tuple[int, int]]]:
    """:func:`side_by_side_own_steps`'s items and its columns as (run id, eval step) pairs (a column of the
    same steps as another is left out: runs with one eval each show it once); ([], []) when the runs share
    no prompt+seed with an image in every column."""
    runs = [run for run in (store.get_run(i) for i in run_ids) if run is not None]
    if not runs:
        return [], []
    samples = {run["id"]: store.samples(run["id"], "eval") for run in runs}
    steps = {run["id"]: sorted({s["step"] for s in samples[run["id"]]}) for run in runs}
    if not all(steps.values()):
        return [], []
    picks = [lambda ss: ss[0], lambda ss: ss[-1]]
    if at is not None:
        picks.append(lambda ss: min(reversed(ss), key=lambda s: abs(s - float(at))))
    groups = [[(run, pick(steps[run["id"]])) for run in runs] for pick in picks]
    groups.sort(key=lambda group: sum(step for _, step in group) / len(group))  # stable: first, at, last
    unique = {tuple(step for _, step in group): group for group in groups}  # one eval only: shown once
    cells = [cell for group in unique.values() for cell in group]
    wanted = {run["id"]: {step for r, step in cells if r["id"] == run["id"]} for run in runs}
    found = _eval_images(runs, samples, runs_root, wanted)
    keys = sorted(set.intersection(*(set(found.get((r["id"], step), {})) for r, step in cells)))
    if not keys:
        return [], []
    stride = max(1, len(keys) // max(1, limit_keys))
    items = []
    for key in keys[::stride][:limit_keys]:
        items += [found[(r["id"], step)][key] for r, step in cells]
    return items, [(int(r["id"]), int(step)) for r, step in cells]

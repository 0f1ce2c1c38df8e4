"""``picks``: a person's own picks as the reward, and ``taste``: a scripted person's hidden score.

``picks`` (options ``picks_per_step``, ``timeout_s``, ``budget``, ``voter``, ``poll_s``, ``l2``). Each training
step (the trainer calls :meth:`PicksReward.set_step` and, once, :meth:`PicksReward.bind` with its store):

1. every group of the rollout gets frozen features (:func:`jagg_engine.preference.image_features`);
2. the groups to ask: all of them with ``picks_per_step: all``, else the ``picks_per_step`` groups where the
   preference model is least sure (:meth:`PreferenceModel.uncertainty`), fewer once ``budget`` votes were
   cast over the run; a group of this step voted on already (a resumed run replays the step) is not asked again;
3. their images go to ``<run>/picks/step_NNNNN/gGG_K.png`` and pending rows of the store
   (:meth:`RunStore.post_pick_groups`); the reward waits, logging "waiting for your picks", until each asked
   group has a vote of ``voter``, or ``timeout_s`` seconds passed (None: no timeout), or the run is cancelled;
   then the step's groups are closed (a vote cast on one later, the step having gone on without it, is kept
   and learnt by the model at the next step: ``picks/late``);
4. the step's votes are scored by the model before they are used (the held-back agreement), then the model is
   refitted on every vote of the run;
5. the reward: with ``picks_per_step: all`` the votes alone (D3PO-style): +1 for a group's best, −1 for its
   worst, 0 for the others and for every sample of a group without a vote; otherwise the refitted model's
   score w · φ of every sample.

Metrics (:meth:`PicksReward.step_metrics`): ``picks/asked``, ``picks/voted`` (this step), ``picks/votes`` and
``picks/wanted`` (the run's total and its budget, or the step's asks times the steps when there is none),
``picks/agreement`` (mean held-back agreement of this step's votes, NaN without one), ``picks/agreement_all``
(of every vote so far), ``picks/timed_out`` (groups closed without a vote), ``picks/late`` (votes on earlier
steps' timed-out groups, learnt at this step; held back like the step's own), ``picks/wait_s``.

Outside training (the eval, or a reward built without a run, as ``jagg eval`` does) the reward is the
model's score; a model without votes scores every image 0.

Only one process asks (config validation refuses ``picks`` with ``processes`` > 1).
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from jagg_engine.picks import TASTES, load_images
from jagg_engine.preference import PreferenceModel, image_features

from .registry import RewardConfigError, register_reward

log = logging.getLogger("jagg.picks")
WAITING = "waiting for your picks"


def _check_picks(**options: Any) -> None:
    """The picks options' values (names are checked by the config against :class:`PicksReward`'s parameters,
    whose defaults fill the options not given)."""
    bound = inspect.signature(PicksReward).bind(**options)
    bound.apply_defaults()
    picks_per_step, timeout_s, budget, voter, poll_s, l2 = (
        bound.arguments[k] for k in ("picks_per_step", "timeout_s", "budget", "voter", "poll_s", "l2")
    )
    if picks_per_step != "all" and (
        isinstance(picks_per_step, bool) or not isinstance(picks_per_step, int) or picks_per_step < 1
    ):
        raise RewardConfigError(
            f"reward picks: picks_per_step must be a positive integer or 'all', got {picks_per_step!r}"
        )
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or not timeout_s >= 0):
        raise RewardConfigError(
            f"reward picks: timeout_s must be a number ≥ 0 or null (wait), got {timeout_s!r}"
        )
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise RewardConfigError(f"reward picks: budget must be a positive integer or null, got {budget!r}")
    if not isinstance(voter, str) or not voter.strip():
        raise RewardConfigError(f"reward picks: voter must be a non-empty name, got {voter!r}")
    if not isinstance(poll_s, (int, float)) or not poll_s > 0:
        raise RewardConfigError(f"reward picks: poll_s must be a number > 0, got {poll_s!r}")
    if not isinstance(l2, (int, float)) or not l2 > 0:
        raise RewardConfigError(f"reward picks: l2 must be a number > 0, got {l2!r}")


class PicksReward:
    """See the module's docstring."""

    def __init__(
        self,
        picks_per_step: int | str = 4,
        timeout_s: float | None = 300.0,
        budget: int | None = None,
        voter: str = "owner",
        poll_s: float = 0.5,
        l2: float = 1.0,
    ):
        self.picks_per_step, self.timeout_s, self.budget = picks_per_step, timeout_s, budget
        self.voter, self.poll_s = voter, poll_s
        self.model = PreferenceModel(l2)
        self.store: Any = None
        self.run_id: int | None = None
        self.run_dir: Path | None = None
        self.group_size = 1
        self.steps: int | None = None
        self.step: int | None = None
        self.used: set[tuple[int, int]] = set()  # (step, group) whose vote the model has
        self.metrics: dict[str, float] = {}

    # ------------------------------------------------------------------ the trainer's calls
    def bind(
        self, store: Any, run_id: int, run_dir: str | Path, group_size: int, steps: int | None = None
    ) -> None:
        """The run this reward asks for: its store and folder. Every vote the run already has (a resumed run)
        goes into the model, its group's features read back from the PNGs in the run folder."""
        self.store, self.run_id, self.run_dir = store, run_id, Path(run_dir)
        self.group_size, self.steps = group_size, steps
        groups = {(g["step"], g["group_index"]): g for g in store.pick_groups(run_id)}
        votes = []
        for v in store.votes(run_id):
            key = (v["step"], v["group_index"])
            if v["voter"] != self.voter or key in self.used:
                continue
            paths = groups[key]["paths"] if key in groups else self._paths(*key)
            try:
                self.model.add_group(key, image_features(load_images(self.run_dir, paths)))
            except OSError:
                log.warning("picks: the images of step %d group %d are gone; its vote is not used", *key)
                continue
            votes.append((key, v["sample"], v["choice"]))
            self.used.add(key)
        if votes:
            self.model.votes.extend(votes)  # known before this process: not scored as held back again
            self.model.fit()
            log.info("picks: %d vote(s) already cast, in the model", len(votes))

    def set_step(self, step: int | None) -> None:
        """The training step the next call scores (None: an eval, which asks nobody)."""
        self.step = step

    def step_metrics(self) -> dict[str, float]:
        return dict(self.metrics)

    # ------------------------------------------------------------------ scoring
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        feats = image_features(images)  # (B, D)
        if self.step is None or self.store is None:
            return self.model.scores(feats)
        G = self.group_size
        if images.shape[0] % G:
            raise ValueError(f"picks: {images.shape[0]} images are not whole groups of {G}")
        groups = feats.reshape(-1, G, feats.shape[1])  # (N, G, D)
        step, n = self.step, groups.shape[0]
        cast = {v["group_index"]: v for v in self.store.votes(self.run_id, step) if v["voter"] == self.voter}
        asked = self.choose(groups, cast)
        self.ask(step, images, prompts, asked)
        started = time.perf_counter()
        votes, timed_out = self.wait(step, asked)
        wait_s = time.perf_counter() - started
        new = [((step, g), v["sample"], v["choice"]) for g, v in votes.items() if (step, g) not in self.used]
        for g in asked:
            self.model.add_group((step, g), groups[g])
        every_vote = self.store.votes(self.run_id)
        late = [  # cast on an earlier step's group after that step went on without it: the model learns it now
            ((v["step"], v["group_index"]), v["sample"], v["choice"])
            for v in every_vote
            if v["voter"] == self.voter and v["step"] != step and (v["step"], v["group_index"]) in self.model.groups
            and (v["step"], v["group_index"]) not in self.used
        ]  # fmt: skip
        new += late
        agreements = self.model.add_votes(new)
        self.used.update(key for key, _, _ in new)
        if self.picks_per_step == "all":
            scores = torch.zeros(n, G)
            for g, v in votes.items():
                if v["choice"] != "skip":
                    scores[g, v["sample"]] = 1.0 if v["choice"] == "best" else -1.0
            scores = scores.flatten()
        else:
            scores = self.model.scores(feats)
        total = len(every_vote)
        wanted = (
            self.budget if self.budget is not None else (len(asked) * self.steps if self.steps else math.nan)
        )
        every = self.model.agreements
        self.metrics = {
            "picks/asked": float(len(asked)),
            "picks/voted": float(len(votes)),
            "picks/votes": float(total),
            "picks/wanted": float(wanted),
            "picks/agreement": sum(agreements) / len(agreements) if agreements else math.nan,
            "picks/agreement_all": sum(every) / len(every) if every else math.nan,
            "picks/timed_out": float(timed_out),
            "picks/late": float(len(late)),
            "picks/wait_s": wait_s,
        }
        return scores

    def choose(self, groups: torch.Tensor, cast: dict[int, Any]) -> list[int]:
        """The groups of this step to ask about (see the module's docstring, 2.), in index order."""
        n = groups.shape[0]
        if self.picks_per_step == "all":
            want = n
        else:
            want = min(int(self.picks_per_step), n)
        if self.budget is not None:
            before = len([v for v in self.store.votes(self.run_id) if v["step"] != self.step])
            want = max(0, min(want, self.budget - before))
        keep = sorted(cast)[:want]  # voted already at this step (a replay): asked again for nothing
        if len(keep) >= want:
            return keep
        others = [g for g in range(n) if g not in cast]
        if self.picks_per_step == "all":
            return sorted(keep + others[: want - len(keep)])
        u = self.model.uncertainty(groups[others])  # (len(others),)
        order = torch.argsort(u, descending=True, stable=True).tolist()
        return sorted(keep + [others[i] for i in order[: want - len(keep)]])

    def _paths(self, step: int, group: int) -> list[str]:
        return [f"picks/step_{step:05d}/g{group:02d}_{k}.png" for k in range(self.group_size)]

    def ask(self, step: int, images: torch.Tensor, prompts: Sequence[str], asked: list[int]) -> None:
        """The asked groups' PNGs in the run folder and their pending rows in the store."""
        from jagg_engine.train.files import save_pngs

        G, rows = self.group_size, []
        for g in asked:
            names = [Path(p).name for p in self._paths(step, g)]
            paths = save_pngs(self.run_dir, f"picks/step_{step:05d}", images[g * G : (g + 1) * G], names)
            rows.append({"group_index": g, "prompt": prompts[g * G], "paths": paths})
        if rows:
            self.store.post_pick_groups(self.run_id, step, rows)

    def wait(self, step: int, asked: list[int]) -> tuple[dict[int, Any], int]:
        """Poll the store until every asked group has a vote, the timeout, or a cancel; then close the step's
        groups. Returns (the step's votes by group, the asked groups left without one)."""
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        said = False
        while True:
            votes = {
                v["group_index"]: v for v in self.store.votes(self.run_id, step) if v["voter"] == self.voter
            }
            missing = [g for g in asked if g not in votes]
            if not missing or self.store.cancel_requested(self.run_id):
                break
            if deadline is not None and time.monotonic() >= deadline:
                log.info(
                    "picks: step %d went on without votes on %d group(s) (timeout %gs)",
                    step,
                    len(missing),
                    self.timeout_s,
                )
                break
            if not said:
                log.info("step %d: %s (%d group(s))", step, WAITING, len(missing))
                said = True
            time.sleep(self.poll_s)
        self.store.close_pick_groups(self.run_id, step)
        # a vote cast between the last read and the close counts
        votes = {v["group_index"]: v for v in self.store.votes(self.run_id, step) if v["voter"] == self.voter}
        return votes, len([g for g in asked if g not in votes])


# The class is the factory: its parameters are the reward's options (the check above refuses bad values first).
register_reward(
    "picks",
    check=_check_picks,
    help="a person's picks in the studio (docs/picks.md); options picks_per_step (int | all), timeout_s, budget,"
    " voter, poll_s, l2",
)(PicksReward)


class Taste:
    def __init__(self, taste: str):
        self.fn = TASTES[taste]

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.fn(images)


def _check_taste(taste: str = "big") -> None:
    if taste not in TASTES:
        raise RewardConfigError(f"reward taste: taste must be one of {', '.join(TASTES)}, got {taste!r}")


@register_reward(
    "taste",
    check=_check_taste,
    help="a scripted person's hidden taste (big: foreground share, red: redness); option taste",
)
def taste(taste: str = "big") -> Taste:
    return Taste(taste)

"""The ``picks`` reward: a tiny-shapes run through `jagg train` with a scripted person voting through the API,
a run nobody votes on (the timeout), a resumed run's votes reused, and the votes-alone reward."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from jagg_engine.picks import ScriptedPerson, taste_big, taste_red, taste_small
from jagg_engine.rewards.picks import PicksReward
from jagg_engine.store import StoreError, open_store

REPO = Path(__file__).resolve().parents[1]
SMALL = [
    "prompts_per_step=2",
    "group_size=4",
    "sampling_steps=6",
    "sde_window_end=4",
    "eval_num_prompts=4",
    "eval_seeds=[0]",
    "eval_every=0",
    "steps=2",
    "rewards={picks: 1.0}",
]


def start(tmp_path: Path, options: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "jagg_engine.cli", "train", *SMALL, f"reward_options={{picks: {options}}}"]
    return subprocess.Popen(
        [*cmd, "--runs-dir", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def wait_for_run(tmp_path: Path, proc: subprocess.Popen) -> int:
    import time

    for _ in range(1200):
        if (tmp_path / "jagg.db").exists():
            try:  # the trainer may be creating the index this very moment
                with open_store(tmp_path) as store:
                    runs = store.list_runs()
            except sqlite3.OperationalError:
                runs = []
            if runs:
                return runs[0]["id"]
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.1)
    raise AssertionError("no run appeared")


def test_a_scripted_person_votes_through_the_api_while_the_run_waits(tmp_path: Path) -> None:
    proc = start(tmp_path, "{picks_per_step: 1, timeout_s: 300, poll_s: 0.05}")
    run_id = wait_for_run(tmp_path, proc)
    store = open_store(tmp_path)
    person = ScriptedPerson(store, run_id, taste="big")
    stop = threading.Event()
    thread = threading.Thread(target=person.run, args=(stop, 0.05), daemon=True)
    thread.start()
    try:
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]
    finally:
        stop.set()
        thread.join(timeout=30)
    run = store.get_run(run_id)
    assert run["status"] == "finished"
    votes = store.votes(run_id)
    assert [(v["step"], v["choice"], v["voter"]) for v in votes] == [
        (1, "best", "owner"),
        (2, "best", "owner"),
    ]
    assert person.cast == 2
    frame = store.metrics_frame(run_id).set_index("step")
    assert frame.loc[[1, 2], "picks/asked"].tolist() == [1.0, 1.0]
    assert frame.loc[[1, 2], "picks/votes"].tolist() == [1.0, 2.0]
    assert frame.loc[[1, 2], "picks/wanted"].tolist() == [2.0, 2.0]  # one a step, two steps
    assert frame.loc[[1, 2], "picks/timed_out"].tolist() == [0.0, 0.0]
    assert frame.loc[1, "picks/agreement"] == 0.5  # the first vote meets an empty model
    assert 0.0 <= frame.loc[2, "picks/agreement"] <= 1.0
    groups = store.pick_groups(run_id)
    assert [g["status"] for g in groups] == ["closed", "closed"]
    assert all((Path(run["run_dir"]) / p).is_file() for g in groups for p in g["paths"])
    assert "waiting for your picks" in (Path(run["run_dir"]) / "train.log").read_text()


def test_nobody_votes_and_the_run_goes_on_after_the_timeout(tmp_path: Path) -> None:
    proc = start(tmp_path, "{picks_per_step: all, timeout_s: 0}")
    assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]
    store = open_store(tmp_path)
    (run,) = store.list_runs()
    frame = store.metrics_frame(run["id"]).set_index("step")
    assert frame.loc[[1, 2], "picks/asked"].tolist() == [2.0, 2.0]  # all: every group of a step
    assert frame.loc[[1, 2], "picks/timed_out"].tolist() == [2.0, 2.0]
    assert math.isnan(frame.loc[2, "picks/agreement"])
    assert frame.loc[[1, 2], "reward/mean"].tolist() == [0.0, 0.0]  # votes alone, no vote: no reward
    group = store.pick_groups(run["id"])[0]
    with pytest.raises(StoreError, match="is finished; votes are taken only while it runs"):
        store.cast_vote(run["id"], group["step"], group["group_index"], 0, "best", "owner")


def images_of(n: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (n, 16, 16, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )


def test_a_resumed_run_reuses_its_votes_and_asks_nothing_twice(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    run_id, folder = store.create_run_folder("picks", {"rewards": {"picks": 1.0}})
    store.claim(run_id, ("queued",), os.getpid())
    images, prompts = images_of(8, 0), ["a"] * 4 + ["b"] * 4  # two groups of 4
    first = PicksReward(picks_per_step=1, timeout_s=30, poll_s=0.01)
    first.bind(store, run_id, folder, group_size=4, steps=3)
    first.set_step(1)
    voter = threading.Thread(
        target=lambda: _vote_when_asked(store, run_id, 1, sample=2), daemon=True
    )  # the person, beside the waiting reward
    voter.start()
    first(images, prompts)
    voter.join(timeout=30)
    (asked,) = store.pick_groups(run_id)
    assert first.metrics["picks/voted"] == 1.0 and first.metrics["picks/timed_out"] == 0.0
    # the process dies; a new one resumes and replays step 1
    again = PicksReward(picks_per_step=1, timeout_s=0)
    again.bind(store, run_id, folder, group_size=4, steps=3)
    assert again.model.votes == [((1, asked["group_index"]), 2, "best")]
    torch.testing.assert_close(again.model.w, first.model.w)  # the same votes, the same model
    again.set_step(1)
    again(images, prompts)
    assert again.metrics["picks/voted"] == 1.0 and again.metrics["picks/timed_out"] == 0.0
    assert len(store.votes(run_id)) == 1 and again.model.votes == first.model.votes  # nothing asked twice


def test_a_vote_after_the_timeout_is_kept_and_learnt_at_the_next_step(tmp_path: Path) -> None:
    """Step 1 times out with nobody voting; the person's vote on its group arrives after (kept, ``late``), and
    step 2's model has it: the step counts it in ``picks/late`` and it is among the model's votes."""
    store = open_store(tmp_path)
    run_id, folder = store.create_run_folder("picks", {"rewards": {"picks": 1.0}})
    store.claim(run_id, ("queued",), os.getpid())
    images, prompts = images_of(8, 0), ["a"] * 4 + ["b"] * 4
    reward = PicksReward(picks_per_step=1, timeout_s=0)
    reward.bind(store, run_id, folder, group_size=4, steps=2)
    reward.set_step(1)
    reward(images, prompts)
    (asked,) = store.pick_groups(run_id)
    assert asked["status"] == "closed" and reward.metrics["picks/timed_out"] == 1.0
    cast = store.cast_vote(run_id, 1, asked["group_index"], 3, "best", "owner")
    assert cast["late"] is True
    with pytest.raises(StoreError, match="already voted"):  # still one vote per group
        store.cast_vote(run_id, 1, asked["group_index"], 0, "best", "owner")
    reward.set_step(2)
    reward(images_of(8, 1), prompts)
    assert reward.metrics["picks/late"] == 1.0 and reward.metrics["picks/timed_out"] == 1.0
    assert ((1, asked["group_index"]), 3, "best") in reward.model.votes
    assert reward.model.w.abs().sum() > 0  # fitted on the late vote (no other vote exists)
    reward.set_step(3)
    reward(images_of(8, 2), prompts)
    assert reward.metrics["picks/late"] == 0.0  # learnt once


def _vote_when_asked(store, run_id: int, step: int, sample: int) -> None:
    import time

    for _ in range(3000):
        pending = store.pick_groups(run_id, "pending")
        if pending:
            store.cast_vote(run_id, step, pending[0]["group_index"], sample, "best", "owner")
            return
        time.sleep(0.01)


def test_votes_alone_reward_best_and_worst(tmp_path: Path) -> None:
    """picks_per_step all: +1 for a group's best, −1 for its worst, 0 elsewhere and for a skipped group."""
    store = open_store(tmp_path)
    run_id, folder = store.create_run_folder("picks", {"rewards": {"picks": 1.0}})
    store.claim(run_id, ("queued",), os.getpid())
    reward = PicksReward(picks_per_step="all", timeout_s=30, poll_s=0.01)
    reward.bind(store, run_id, folder, group_size=2, steps=1)
    reward.set_step(1)

    def person() -> None:
        import time

        while len(store.pick_groups(run_id, "pending")) < 3:
            time.sleep(0.01)
        store.cast_vote(run_id, 1, 0, 1, "best", "owner")
        store.cast_vote(run_id, 1, 1, 0, "worst", "owner")
        store.cast_vote(run_id, 1, 2, None, "skip", "owner")

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    scores = reward(images_of(6, 1), ["x"] * 6)
    thread.join(timeout=30)
    torch.testing.assert_close(scores, torch.tensor([0.0, 1.0, -1.0, 0.0, 0.0, 0.0]))
    assert reward.metrics["picks/voted"] == 3.0


def test_tastes() -> None:
    black = torch.zeros(2, 8, 8, 3, dtype=torch.uint8)
    black[0, :4, :, 0] = 255  # half the image red
    black[1, :2, :, 2] = 255  # a quarter blue
    torch.testing.assert_close(taste_big(black), torch.tensor([0.5, 0.25]))
    torch.testing.assert_close(taste_red(black), torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(taste_small(black), torch.tensor([0.5, 0.75]))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["reward_options={picks: {picks_per_step: 0}}"],
            "reward_options.picks: reward picks: picks_per_step must be a positive integer or 'all', got 0",
        ),
        (
            ["reward_options={picks: {picks_per_step: many}}"],
            "picks_per_step must be a positive integer or 'all', got 'many'",
        ),
        (
            ["reward_options={picks: {picks_per_step: 40}}", "prompts_per_step=18"],
            "reward_options.picks.picks_per_step: 40 is more than the 18 groups of a step",
        ),
        (
            ["reward_options={picks: {timeout_s: -1}}"],
            "reward picks: timeout_s must be a number ≥ 0 or null (wait), got -1",
        ),
        (
            ["reward_options={picks: {budget: 0}}"],
            "reward picks: budget must be a positive integer or null, got 0",
        ),
        (["reward_options={picks: {voter: ''}}"], "reward picks: voter must be a non-empty name"),
        (
            ["reward_options={picks: {colour: red}}"],
            "reward_options.picks.colour: unknown option; allowed: budget, l2, picks_per_step",
        ),
        (["processes=2"], "rewards: picks asks its person from one process; needs processes 1, got 2"),
    ],
)
def test_config_refusals_name_the_field(overrides: list[str], message: str) -> None:
    from jagg_engine.train.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config(None, ["rewards={picks: 1.0}", *overrides], check_environment=False)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_valid_picks_config_with_null_timeout_and_a_weighted_mix() -> None:
    from jagg_engine.train.config import load_config

    cfg = load_config(
        None,
        [
            "rewards={picks: 0.7, shapes: 0.3}",
            "reward_options={picks: {picks_per_step: all, timeout_s: null}}",
        ],
        check_environment=False,
    )
    assert cfg.rewards == {"picks": 0.7, "shapes": 0.3}
    assert cfg.reward_options["picks"] == {"picks_per_step": "all", "timeout_s": None}

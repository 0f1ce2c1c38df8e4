"""Off-policy mini-batches: updates_per_rollout = M splits a rank's rollout into M optimizer steps; on the later
ones the PPO ratio and clip act, and the rollout's velocities are reused on the first one only."""

import pytest
import torch

from jagg_engine.store import open_store
from jagg_engine.train.config import load_config
from jagg_engine.train.trainer import Trainer, minibatch_indices

LINEAR = [
    "backbone=linear-toy",
    "rewards={brightness: 1.0}",
    "prompts_per_step=2",
    "group_size=4",
    "sampling_steps=6",
    "sde_window_end=4",
    "window=4",
    "reuse_rollout_velocity=auto",
    "eval_every=0",
    "sample_every=0",
    "checkpoint_every=0",
    "lr=3e-2",
    "clip_range=1e-5",
    "adv_std=group",
]


def make_trainer(tmp_path, *overrides):
    cfg = load_config(None, [*LINEAR, *overrides], check_environment=False)
    store = open_store(tmp_path)
    run_id = store.create_run(cfg.name, cfg.to_dict(), tmp_path / "run")
    return Trainer(cfg, run_id, str(tmp_path))


def rollout_of_step(trainer, step):
    prompts, groups = trainer.step_prompts(step)
    traj = trainer.sample(step, prompts)
    total, _, _ = trainer.score(traj, prompts)
    adv, _ = trainer.advantages(total, groups)
    return traj, adv


def test_second_minibatch_is_off_policy_and_reuse_only_on_the_first(tmp_path):
    trainer = make_trainer(tmp_path, "updates_per_rollout=2", "train_micro_batch=3")
    traj, adv = rollout_of_step(trainer, 1)
    before = [p.detach().clone() for p in trainer.params]
    results, norms = trainer.update_phase(1, traj, adv)
    first, second = results
    assert len(norms) == 2 and all(n > 0 for n in norms)
    # mini-batch 1: the sampling policy — ratio 1 up to round-off, nothing clipped, the inner velocities reused
    assert first.ratio_mean == pytest.approx(1.0, abs=1e-9) and first.clipfrac == 0.0
    assert first.counts.reused == 2 * 2  # 2 inner steps × 2 micro-batches of (3, 1) samples
    # mini-batch 2: after one optimizer step the ratio moves and the small clip range clips; no reuse
    assert abs(second.ratio_mean - 1.0) > 1e-5 and second.clipfrac > 0
    assert second.counts.reused == 0 and second.counts.forward_nograd == 2 * 2
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.params))


def test_train_step_metrics_with_two_minibatches(tmp_path):
    trainer = make_trainer(tmp_path, "updates_per_rollout=2")
    metrics = trainer.train_step(1)
    assert metrics["count/optimizer_steps"] == 2.0
    assert metrics["count/reused"] == 2.0  # the first mini-batch's 2 inner steps, none on the second
    assert metrics["loss/clipfrac_offpolicy"] > 0 and metrics["loss/clipfrac"] > 0
    assert metrics["loss/ratio_dev_offpolicy"] > 1e-5


def test_one_update_per_rollout_is_the_whole_batch_in_order(tmp_path):
    trainer = make_trainer(tmp_path)
    assert minibatch_indices(trainer.cfg, 1, 0, 8) == [None]
    metrics = trainer.train_step(1)
    assert metrics["count/optimizer_steps"] == 1.0 and metrics["count/reused"] == 2.0
    assert metrics["loss/clipfrac"] == 0.0 and "loss/clipfrac_offpolicy" not in metrics


def test_minibatches_partition_the_samples_reproducibly(tmp_path):
    cfg = load_config(None, [*LINEAR, "updates_per_rollout=4"], check_environment=False)
    parts = minibatch_indices(cfg, 3, 0, 8)
    assert len(parts) == 4 and sorted(torch.cat(parts).tolist()) == list(range(8))
    assert all(torch.equal(a, b) for a, b in zip(parts, minibatch_indices(cfg, 3, 0, 8)))  # resume replays it
    assert not all(torch.equal(a, b) for a, b in zip(parts, minibatch_indices(cfg, 4, 0, 8)))


def test_fused_optimizer_reuse_on_the_first_minibatch_only(tmp_path):
    """A fused AdamW step moves no version counter; the second mini-batch still reuses nothing."""
    trainer = make_trainer(tmp_path, "updates_per_rollout=2")
    trainer.optimizer = torch.optim.AdamW(trainer.params, lr=3e-2, weight_decay=1e-4, fused=True)
    traj, adv = rollout_of_step(trainer, 1)
    versions = [p._version for p in trainer.params]
    first, second = trainer.update_phase(1, traj, adv)[0]
    assert [p._version for p in trainer.params] == versions  # the steps happened unseen by the counters
    assert first.counts.reused == 2 and first.counts.forward_nograd == 0
    assert second.counts.reused == 0 and second.counts.forward_nograd == 2


def test_trainer_control_flow_alone_forbids_stale_reuse(tmp_path, monkeypatch):
    """With the guard switched off (always yes), the trainer still reuses only on the first mini-batch of a
    rollout, and not at all after a checkpoint load since the rollout."""
    import jagg_engine.jagg as engine

    monkeypatch.setattr(engine, "can_reuse_velocities", lambda model, traj: True)
    trainer = make_trainer(tmp_path, "updates_per_rollout=2")
    traj, adv = rollout_of_step(trainer, 1)
    first, second = trainer.update_phase(1, traj, adv)[0]
    assert (first.counts.reused, second.counts.reused) == (2, 0)

    trainer.store.log_step(trainer.run_id, 1, {"reward/mean": 0.0})  # a checkpoint is resumed only past
    trainer.save_checkpoint(1)  # a logged step
    traj, adv = rollout_of_step(trainer, 2)
    assert trainer.load_checkpoint() == 1  # a weight load after the rollout
    first, second = trainer.update_phase(2, traj, adv)[0]
    assert (first.counts.reused, second.counts.reused) == (0, 0)

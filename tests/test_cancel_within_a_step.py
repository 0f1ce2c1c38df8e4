"""A stop asked for mid-step reaches the trainer within that step: asked during a step's rollout, the step's
update is never applied (the run ends at the step before, with its checkpoint); asked during the update of a
step that evaluates, the step is logged without its eval and the run ends there. Counted in steps, not seconds."""

from __future__ import annotations

from jagg_engine.store import open_store
from jagg_engine.train.config import load_config
from jagg_engine.train.trainer import Trainer

SMALL_FLUX = [
    "backbone=tiny-flux", "rewards={brightness: 1.0}", "prompts_per_step=2", "group_size=3", "sampling_steps=6",
    "sde_window_end=4", "window=4", "sample_every=0", "checkpoint_every=0", "lr=1e-3", "steps=6",
]  # fmt: skip


def _trainer(tmp_path, *overrides: str) -> tuple[Trainer, object, int]:
    cfg = load_config(None, [*SMALL_FLUX, *overrides], check_environment=False)
    store = open_store(tmp_path)
    run_id = store.create_run("cancel", cfg.to_dict(), tmp_path / "cancel")
    return Trainer(cfg, run_id, str(tmp_path)), store, run_id


def _logged(store, run_id: int) -> list[int]:
    frame = store.metrics_frame(run_id)
    return sorted(int(s) for s in frame.loc[frame["reward/mean"].notna(), "step"])


def test_a_stop_asked_during_a_rollout_stops_before_that_steps_update(tmp_path):
    trainer, store, run_id = _trainer(tmp_path, "eval_every=0")
    sample, updated = trainer.sample, []
    update_phase = trainer.update_phase

    def sample_then_cancel(step, prompts):
        traj = sample(step, prompts)
        if step == 3:  # the user presses Confirm while step 3 samples
            store.request_cancel(run_id)
        return traj

    def record(step, *args):
        updated.append(step)
        return update_phase(step, *args)

    trainer.sample, trainer.update_phase = sample_then_cancel, record
    assert trainer.run() == "cancelled"
    assert updated == [1, 2] and _logged(store, run_id) == [
        1,
        2,
    ]  # step 3's rollout is dropped, never applied
    run = store.get_run(run_id)
    assert run["last_step"] == 2, run  # (the status is set by the caller of run(), from "cancelled")
    assert (trainer.run_dir / "checkpoints" / "step_00002" / "manifest.json").is_file()


def test_a_stop_asked_during_an_update_skips_the_steps_eval_and_stops_there(tmp_path):
    trainer, store, run_id = _trainer(tmp_path, "eval_every=2", "eval_num_prompts=2", "eval_seeds=[0]")
    update_phase, evaluated = trainer.update_phase, []
    evaluate = trainer.evaluate

    def update_then_cancel(step, *args):
        out = update_phase(step, *args)
        if step == 4:  # Confirm pressed during step 4's update, before its eval
            store.request_cancel(run_id)
        return out

    def record(step):
        evaluated.append(step)
        return evaluate(step)

    trainer.update_phase, trainer.evaluate = update_then_cancel, record
    assert trainer.run() == "cancelled"
    assert evaluated == [0, 2] and _logged(store, run_id) == [1, 2, 3, 4]
    assert store.get_run(run_id)["last_step"] == 4

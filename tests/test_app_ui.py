"""app/ui.py's pure parts (form → config, space mode, cost-model note), the Blocks it builds, and launch.py's
flags — without serving anything."""

from __future__ import annotations

import importlib
import sys

import pytest

import launch
from app import ui
from app.space import CAPS
from jagg_engine.train.config import ConfigError

FORM = {
    "name": "t",
    "backbone": "tiny-flux",
    "model_path": "",
    "rewards": "brightness: 1",
    "algorithm": "flow-grpo",
    "window": 4,
    "jagg_frac": 0.5,
    "cv_frac": 0.0,
    "jagg_until_step": 0,
    "strategy": "jagg",
    "steps": 3,
    "group_size": 4,
    "lr": 1e-4,
    "seed": 7,
    "processes": 1,
    "overrides": "sampling_steps=6\nsde_window_end=null",
}


def _cfg(tmp_path, space_mode=False, **changes):
    return ui.form_config(tmp_path / "runs", *{**FORM, **changes}.values(), space_mode=space_mode)


def test_form_values_become_a_validated_config(tmp_path):
    cfg = _cfg(tmp_path)
    assert (cfg.backbone, cfg.window, cfg.jagg_frac, cfg.steps, cfg.seed, cfg.sampling_steps) == (
        "tiny-flux", 4, 0.5, 3, 7, 6,
    )  # fmt: skip
    assert cfg.rewards == {"brightness": 1.0}
    assert cfg.output_dir == str((tmp_path / "runs").resolve())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"window": 1},
            "window: must be an integer >= 2 for strategy jagg (a one-step window trains with strategy=exact), got 1",
        ),
        ({"jagg_frac": 1.5}, "jagg_frac: must be a number in [0, 1], got 1.5"),
        ({"rewards": "nope: 1"}, "rewards: unknown reward 'nope'"),
        ({"rewards": "brightness: lots"}, "rewards: weight of 'brightness' must be a number"),
        ({"overrides": "sampling_stepz=6"}, "did you mean 'sampling_steps'"),
        ({"backbone": "tiny-shapes", "model_path": "./no/such/folder"}, "model_path: no such file or folder"),
        ({"steps": None}, "steps: must not be empty"),
    ],
)
def test_invalid_form_values_give_the_config_error(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=None) as err:
        _cfg(tmp_path, **changes)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_space_mode_refuses_paths_other_backbones_and_long_runs(tmp_path):
    base = {"backbone": "tiny-shapes", "rewards": "shapes-dense: 1"}
    with pytest.raises(ConfigError, match="backbone: this Space offers only tiny-shapes"):
        _cfg(tmp_path, space_mode=True, backbone="flux")
    with pytest.raises(ConfigError, match="model_path: this Space accepts no file or folder paths"):
        _cfg(tmp_path, space_mode=True, model_path="/etc", **base)
    with pytest.raises(ConfigError, match="prompts_file: this Space accepts no file"):
        _cfg(tmp_path, space_mode=True, overrides="prompts_file=/etc/passwd.txt", **base)
    with pytest.raises(ConfigError, match=f"steps: this Space allows at most {CAPS['steps']}, got 31"):
        _cfg(tmp_path, space_mode=True, steps=CAPS["steps"] + 1, **base)
    with pytest.raises(ConfigError, match="processes: this Space allows at most 1, got 2"):
        _cfg(tmp_path, space_mode=True, processes=2, overrides="prompts_per_step=2", **base)


def test_space_mode_comes_from_space_id(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert not ui.space_mode_from_env()
    monkeypatch.setenv("SPACE_ID", "someone/jagg-studio")
    assert ui.space_mode_from_env()


def test_parse_helpers():
    assert ui.parse_rewards("a: 1, b=0.5\nc") == {"a": 1.0, "b": 0.5, "c": 1.0}
    assert ui.parse_overrides("x=1 y=2\n# note\nrewards={a: 1, b: 2}\n") == [
        "x=1",
        "y=2",
        "rewards={a: 1, b: 2}",
    ]


def test_speedup_note_uses_the_cost_model():
    assert "1.29×" in ui.speedup_note(4, 1.0, "jagg", 1.8)  # 7.2 / 5.6
    assert "2.00×" in ui.speedup_note(4, 1.0, "jagg", 1.8, reuse=True)  # 7.2 / 3.6
    assert "1.57×" in ui.speedup_note(4, 1.0, "jagg", 1.8, reuse=True, updates_per_rollout=2)  # 7.2 / 4.6
    assert ui.speedup_note(4, 1.0, "endpoint", 1.8, reuse=True) == ui.speedup_note(4, 1.0, "endpoint", 1.8)
    # endpoint, and pair without its control variate: two steps with grad a window, no inner forward: 7.2 / 3.6
    note = ui.speedup_note(4, 1.0, "endpoint", 1.8)
    assert "2.00×" in note and "endpoint 3.6" in note
    note = ui.speedup_note(4, 1.0, "pair", 1.8, reuse=True, pair_credits=False)
    assert "2.00×" in note and "pair 3.6, unbiased" in note
    # pair as the form launches it (pair_cv = 1) reads every step's credit: JAGG's cost, reuse included
    note = ui.speedup_note(4, 1.0, "pair", 1.8)
    assert "1.29×" in note and "pair 5.6, unbiased, every step's credit read" in note
    assert "2.00×" in ui.speedup_note(4, 1.0, "pair", 1.8, reuse=True)
    assert "1.57×" in ui.speedup_note(4, 1.0, "pair", 1.8, reuse=True, updates_per_rollout=2)
    assert "1.00×" in ui.speedup_note(4, 1.0, "exact", 1.8)
    assert "needs W ≥ 2" in ui.speedup_note(1, 1.0, "jagg", 1.8)
    # the control variate: a quarter of the inner steps' pairs also by the exact backward, 3.6 + 0.25·2·1.8
    note = ui.speedup_note(4, 1.0, "jagg", 1.8, reuse=True, cv_frac=0.25)
    assert "1.60×" in note and "control variate's 0.9" in note
    assert "1.20×" in ui.speedup_note(4, 1.0, "jagg", 1.8, cv_frac=0.25)  # 0.75·2 + 3.6 + 0.25·2·1.8 = 6.0
    assert "needs W ≥ 2" in ui.speedup_note(4, 1.0, "jagg", 1.8, cv_frac=1.5)
    # JAGG to step 40 of 70, exact after: 70 / (40 / 2 + 30)
    switched = ui.speedup_note(4, 1.0, "jagg", 1.8, reuse=True, jagg_until_step=40, steps=70)
    assert (
        "2.00×" in switched
        and "JAGG for steps 1–40, exact after: **1.40×** over the run's 70 steps" in switched
    )
    for until in (0, 70, None):  # no switch, or one at the end: no whole-run line
        assert "exact after" not in ui.speedup_note(4, 1.0, "jagg", 1.8, jagg_until_step=until, steps=70)


def test_build_app_wires_named_endpoints_and_builds_nothing_at_import(tmp_path):
    sys.modules.pop("app.ui", None)
    module = importlib.import_module("app.ui")
    assert not any(type(v).__name__ == "Blocks" for v in vars(module).values())
    demo = module.build_app(tmp_path / "runs", space_mode=True, background_ticks=False)
    try:
        names = {
            d.get("api_name") for d in demo.config["dependencies"] if d.get("api_visibility") != "private"
        }
        assert {
            "launch_run", "compare_exact_jagg", "predict_speedup", "live_view", "cancel_run",
            "compare_runs", "history", "delete_run", "export_run", "resume_run", "owner_login", "owner_file",
            "resume_live_run", "duplicate_run", "step_images",
        } <= names  # fmt: skip
        assert demo.jagg_runs_dir == (tmp_path / "runs").resolve()
        assert (tmp_path / "runs" / "jagg.db").exists()
    finally:
        demo.jagg_manager.shutdown()


def test_launch_flags_and_exposure_warning(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    args = launch.parse_args([])
    assert (args.host, args.port, args.auth, args.share, args.runs_dir) == (
        "127.0.0.1",
        7860,
        None,
        False,
        "runs",
    )
    args = launch.parse_args(["--host", "0.0.0.0", "--port", "9000", "--auth", "u:p:q", "--share"])
    assert (args.host, args.port, args.auth, args.share) == ("0.0.0.0", 9000, "u:p:q", True)
    with pytest.raises(SystemExit):
        launch.parse_args(["--auth", "nocolon"])
    assert launch.exposure_warning("127.0.0.1", None, False) is None
    assert launch.exposure_warning("localhost", None, False) is None
    assert "without --auth" in launch.exposure_warning("0.0.0.0", None, False)
    assert "share link" in launch.exposure_warning("127.0.0.1", None, True)
    assert launch.exposure_warning("0.0.0.0", ("u", "p"), False) is None
    assert launch.exposure_warning("0.0.0.0", None, False, space=True) is None
    monkeypatch.setenv("SPACE_ID", "someone/jagg-studio")
    assert launch.parse_args([]).host == "0.0.0.0"


def test_a_component_updated_in_a_session_still_refuses_bad_input_in_one_line():
    """gradio keeps a copy of a component a handler updated (new bounds, new choices) in that session's
    state and preprocesses the copy: a wrong value sent to that session is still one line naming the
    component, as for a session that never updated it."""
    import asyncio

    import gradio as gr
    from gradio.state_holder import SessionState

    with gr.Blocks() as demo:
        step = gr.Slider(0, 1, value=1, step=1, label="step")
        out = gr.Textbox()
        widen = gr.Button()
        widen.click(lambda: gr.update(maximum=8), None, step, api_name="widen")
        gr.Button().click(lambda v: f"step {v:g}", step, out, api_name="show")
    ui.readable_api_errors(demo)
    fns = {f.api_name: f for f in demo.fns.values()}
    state = SessionState(demo)
    asyncio.run(demo.process_api(fns["widen"], [], state))
    assert (
        state.blocks_config.blocks[step._id] is not step and state.blocks_config.blocks[step._id].maximum == 8
    )
    assert asyncio.run(demo.process_api(fns["show"], [5], state))["data"] == [
        "step 5"
    ]  # the session's bounds
    for session in (state, None):
        with pytest.raises(gr.Error) as caught:
            asyncio.run(demo.process_api(fns["show"], ["five"], session))
        bound = 8 if session else 1
        assert caught.value.message == f"step: must be a number from 0 to {bound}, got 'five'"

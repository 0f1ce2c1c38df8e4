"""The New run form's whole-number fields (W, steps, group size, seed, processes): a fraction is refused in
one line naming the field, never rounded into a run that starts."""

from __future__ import annotations

import pytest

from app import form, ui
from app.form import FORM_FIELDS, FORM_LABELS, form_config, form_name, speedup_note

FIELDS = {"window": "W (window)", "steps": "steps", "group_size": "group size", "seed": "seed"}


@pytest.fixture
def demo(tmp_path):
    demo = ui.build_app(tmp_path / "runs", background_ticks=False, showcase_dir=None)
    yield demo
    demo.jagg_stop_ticker.set()
    demo.jagg_manager.shutdown()


def _form(demo) -> dict:
    fn = next(f for f in demo.fns.values() if f.api_name == "launch_run")
    return fn, dict(zip(FORM_FIELDS, (c.value for c in fn.inputs), strict=True))


@pytest.mark.parametrize("key", list(FIELDS))
def test_a_fraction_in_a_whole_number_field_is_refused_not_rounded(demo, key):
    fn, values = _form(demo)
    box = fn.inputs[FORM_FIELDS.index(key)]
    assert box.label == FIELDS[key]
    assert box.preprocess(2.5) == 2.5  # what was typed reaches the app (precision=0 would make it 2)
    values[key] = 2.5
    message, run_id, _ = fn.fn(*values.values(), None)  # no request: a local session
    assert message == f"**Not launched.** {form_name(key)}: must be an int, got 2.5", message
    assert run_id is None
    assert demo.jagg_manager.store.list_runs() == []


def test_a_whole_number_typed_as_a_float_is_taken(demo):
    fn, values = _form(demo)
    values |= {"window": 4.0, "steps": 2.0, "group_size": 4.0, "seed": 3.0}
    cfg = form_config(demo.jagg_runs_dir, *values.values())
    assert (cfg.window, cfg.steps, cfg.group_size, cfg.seed) == (4, 2, 4, 3)


def test_the_prediction_asks_for_a_whole_window():
    assert "needs W ≥ 2 (a whole number)" in speedup_note(2.5, 1.0, "jagg", 1.8)
    assert "needs W" not in speedup_note(4.0, 1.0, "jagg", 1.8)  # 4.0 is a whole window


def test_a_refusal_names_the_forms_box_not_only_its_config_key(demo):
    """A refusal of the New run form names the box as the form labels it, the config key in parentheses; a
    line about the more-settings box's text is headed by that box's label."""
    fn, values = _form(demo)
    for key, label in FORM_LABELS.items():  # each name is how its box's label starts
        assert fn.inputs[FORM_FIELDS.index(key)].label.startswith(label), key
    pair = next(f for f in demo.fns.values() if f.api_name == "compare_exact_jagg")
    for changes, expected in [
        ({"group_size": 1}, "group size (group_size): must be an integer >= 2, got 1"),
        (  # the box's label says "0 = throughout": the refusal offers 0, not the config's null
            {"jagg_until_step": -1},
            "JAGG until step (jagg_until_step): must be an integer >= 1, or 0 (jagg throughout), got -1",
        ),
        ({"window": 1}, "W (window): must be an integer >= 2 for strategy jagg"),
        ({"overrides": "zzz=1"}, "more settings: unknown field 'zzz'"),
        ({"overrides": "window"}, "more settings: override 'window': must look like name=value"),
        ({"steps": 0}, "steps: must be an integer >= 1, got 0"),  # a box labelled by its key
    ]:
        for handler in (fn, pair):
            message, run_id, _ = handler.fn(*{**values, **changes}.values(), None)
            assert message.startswith(f"**Not launched.** {expected}"), (changes, message)
            assert run_id is None
    message, _, _ = pair.fn(*{**values, "overrides": "probe_every=2"}.values(), None)
    assert message.startswith("**Not launched.** the pair's exact run: probe_every: "), message
    assert demo.jagg_manager.store.list_runs() == []


@pytest.mark.parametrize("key", ["jagg_frac", "cv_frac"])
@pytest.mark.parametrize("typed", [2, -0.5])
def test_a_fraction_out_of_range_is_refused_not_clamped(demo, key, typed):
    """A fraction typed outside [0, 1] reaches the app as typed (no box that clamps it to the nearest bound, no
    toast) and Launch refuses it in one line naming the field and the allowed range; nothing is queued."""
    fn, values = _form(demo)
    box = fn.inputs[FORM_FIELDS.index(key)]
    assert box.preprocess(typed) == typed
    assert (
        getattr(box, "minimum", None) is None and getattr(box, "maximum", None) is None
    )  # the page clamps none
    values[key] = typed
    for api in ("launch_run", "compare_exact_jagg"):
        handler = next(f for f in demo.fns.values() if f.api_name == api)
        message, run_id, _ = handler.fn(*values.values(), None)
        assert message == f"**Not launched.** {key}: must be a number in [0, 1], got {float(typed)}", message
        assert run_id is None
    assert demo.jagg_manager.store.list_runs() == []


def _picks_form(demo, **changes) -> dict:
    _, values = _form(demo)
    return {**values, "rewards": "picks: 1", "steps": 2, **changes}


def test_the_picks_wait_box_sets_the_rewards_timeout_and_more_settings_wins(demo):
    """The box "picks: wait for votes (s)" writes reward_options.picks.timeout_s (0: null, wait for every vote)
    when it differs from the reward's default; a run without picks ignores it; a more-settings line that sets the
    option wins over the box."""
    from jagg_engine.rewards.picks import PicksReward

    assert PicksReward(voter="x").timeout_s == form.PICKS_TIMEOUT_DEFAULT  # the app restates it without torch

    def options(**changes) -> dict:
        return form_config(demo.jagg_runs_dir, *_picks_form(demo, **changes).values()).reward_options

    assert options(picks_timeout_s=60) == {"picks": {"timeout_s": 60.0}}
    assert options(picks_timeout_s=form.NO_TIMEOUT) == {"picks": {"timeout_s": None}}
    assert options() == {}  # the default: the reward's own
    assert options(rewards="shapes-dense: 1", picks_timeout_s=60) == {}
    box = "reward_options={picks: {timeout_s: 5, picks_per_step: 2}}"
    assert options(picks_timeout_s=60, overrides=box) == {"picks": {"timeout_s": 5, "picks_per_step": 2}}
    box = "reward_options={picks: {picks_per_step: 2}}"
    assert options(picks_timeout_s=0, overrides=box) == {"picks": {"picks_per_step": 2, "timeout_s": None}}


@pytest.mark.parametrize("typed", [-1, None, "soon"])
def test_a_bad_picks_wait_is_refused_in_one_line_naming_the_box(demo, typed):
    fn, _ = _form(demo)
    message, run_id, _ = fn.fn(*_picks_form(demo, picks_timeout_s=typed).values(), None)
    assert message.startswith(
        "**Not launched.** picks: wait for votes (s) (picks_timeout_s): must be a number of seconds >= 0"
        " (0 = wait for every vote), got "
    ), message
    assert "\n" not in message and run_id is None
    assert demo.jagg_manager.store.list_runs() == []


@pytest.mark.parametrize("timeout, box", [(None, 0), (60.0, 60.0), (300.0, 300.0), (0.0, 300.0)])
def test_duplicate_of_a_picks_run_gives_its_wait_back(demo, timeout, box):
    """Duplicate shows a picks run's timeout in its box where the box can say it (null as 0, any other time but
    the default); a timeout of 0 s (do not wait) and an explicit default stay in more settings. Either way the
    form rebuilds the same config."""
    from app.form import config_form_values, form_fields_config
    from jagg_engine.train.config import TrainConfig

    options = {"picks": {"timeout_s": timeout, "picks_per_step": 2}}
    config = TrainConfig(rewards={"picks": 1.0}, reward_options=options).to_dict()
    values = dict(zip(FORM_FIELDS, config_form_values(config), strict=True))
    assert values["picks_timeout_s"] == box
    assert ("timeout_s" in values["overrides"]) == (box == form.PICKS_TIMEOUT_DEFAULT)
    assert form_fields_config(*values.values()).to_dict() == config

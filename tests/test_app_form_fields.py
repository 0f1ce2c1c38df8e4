"""The New run form's whole-number fields (W, steps, group size, seed, processes): a fraction is refused in
one line naming the field, never rounded into a run that starts."""

from __future__ import annotations

import pytest

from app import ui
from app.form import FORM_FIELDS, form_config, speedup_note

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
    assert message == f"**Not launched.** {key}: must be an int, got 2.5", message
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

"""The app process draws its pages without importing torch (or diffusers).

In a fresh interpreter: build the app over a runs folder holding a small real history (the shipped showcase,
two recorded runs with metrics, probes and eval images, plus a failed run written through the store), then
call every handler the New run, Live, Compare and History tabs wire (the page load, the timer, each button and
dropdown) and draw each output as gradio would (the component's postprocess). Only the two launch buttons are
left out: a launch validates the config against the engine's registries and starts a training. Then neither
torch nor diffusers may be in ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Handlers that start a training (and validate the config with the engine): the only ones not drawn here.
LAUNCHES = ("launch_run", "compare_exact_jagg")

SCRIPT = r"""
import inspect, json, sys
from pathlib import Path

import gradio as gr
from PIL import Image

from app import data, ui
from jagg_engine.store import open_store
from jagg_engine.train.config import TrainConfig

runs = Path(sys.argv[1])
launches = set(json.loads(sys.argv[2]))
noop = lambda run_id, runs_dir: [sys.executable, "-c", "pass"]

# A failed run, written through the store as the trainer writes one: metrics, an eval image, a log.
store = open_store(runs)
run_dir = runs / "run-failed"
config = {**TrainConfig().to_dict(), "name": "failed", "steps": 4}
failed = store.create_run("failed", config, run_dir)
store.set_status(failed, "running", pid=None)
for step in range(2):
    store.log_step(failed, step, {"reward/mean": 0.1 * step, "reward/std": 0.05, "time/sampling": 0.5,
                                  "time/reward": 0.1, "time/update_forward": 0.4, "time/update_backward": 0.6,
                                  "time/update": 1.0, "count/backward": 4})
(run_dir / "samples" / "eval").mkdir(parents=True)
Image.new("RGB", (8, 8), (255, 0, 0)).save(run_dir / "samples" / "eval" / "000_seed0.png")
store.log_samples(failed, 0, [{"kind": "eval", "prompt": "a red circle", "seed": 0, "reward": 0.5,
                               "path": "samples/eval/000_seed0.png"}])
(run_dir / "train.log").write_text("step 0\nstep 1\nTraceback: out of memory\n")
store.set_status(failed, "failed", error="out of memory")
store.close()

demo = ui.build_app(runs, space_mode=False, command=noop, resume_command=noop, r_default=1.8,
                    background_ticks=False)
showcase = list(demo.jagg_showcase_ids)
assert len(showcase) >= 2, showcase
ids = [*showcase, failed]
demo.get_config_file()  # the page as first sent to a browser: every component's initial value

# Arguments per handler (by api_name, else by function name); any other handler gets the values its input
# components show on the page, as a click would send them.
run_id_args = [(i,) for i in ids] + [(None,), ("nope",)]
known = {
    "predict_speedup": [(4, 1.0, "jagg", 1.8), (8, 0.5, "endpoint", 3.0), (1, 1.0, "jagg", 1.8)],
    "live_view": [(i, 1.8) for i in ids] + [(None, 1.8), ("nope", 1.8)],
    "on_tick": [(i, 1.8, None, None) for i in ids],
    "on_load": [(1.8,)],
    "compare_runs": [(showcase, 1.8), (ids, 3.0), ([ids[0]], 1.8)],
    "history": [()],
    "export_run": run_id_args,
    "cancel_run": run_id_args,
    "resume_run": [(failed,), (showcase[0],), (None,)],
    "delete_run": [(None, False), (10**6, False)],
    "resume_live_run": [(failed,), (None,)],
    "duplicate_run": [(i,) for i in ids] + [(None,)],
    "step_images": [(i, kind, step) for i in ids for kind in ("eval", "train") for step in (0, 10**6)],
    "owner_login": [("wrong",)],
    "owner_file": [("jagg.db",)],
    # Try it and Export model: no run here has a checkpoint, so each is refused before a worker starts
    "try_it": [(i, None, "red circle", "0") for i in ids] + [(None, None, "red circle", "0")],
    "try_it_steps": run_id_args,
    "try_it_cancel": [()],
    "export_model": run_id_args,
}


def outputs(fn, result):
    values = result if isinstance(result, (tuple, list)) and len(fn.outputs) > 1 else (result,)
    for component, value in zip(fn.outputs, values):
        if isinstance(value, dict) and "value" in value:
            value = value["value"]  # gr.update(value=…, visible=True): that value is drawn
        if isinstance(value, dict) or value is None or type(value).__name__ == "_Skip":
            continue  # gr.update / gr.skip: a change of properties, nothing to draw
        yield component, value


def draw(fn, result):
    for component, value in outputs(fn, result):
        if hasattr(component, "postprocess"):
            component.postprocess(value)


def shown(fn, result):
    # What a user sees of one output: plots with curves, gallery images, table rows.
    out = {"plots_with_traces": 0, "images": 0, "rows": 0}
    for component, value in outputs(fn, result):
        kind = type(component).__name__
        if kind == "Plot" and len(getattr(value, "data", ())) > 0:
            out["plots_with_traces"] += 1
        elif kind == "Gallery":
            out["images"] += len(value)
        elif kind == "Dataframe":
            out["rows"] = max(out["rows"], len(value))
    return out


called, drawn = [], {}
for fn in demo.fns.values():
    name = fn.api_name or getattr(fn.fn, "__name__", "")
    if fn.fn is None or name in launches:
        continue
    calls = known.get(name) or known.get(getattr(fn.fn, "__name__", "")) or [
        tuple(getattr(c, "value", None) for c in fn.inputs)
    ]
    for args in calls:
        result = fn.fn(*args)
        if inspect.isgenerator(result):  # a generator's outputs: each value it yields is drawn
            for result in list(result):
                draw(fn, result)
        draw(fn, result)
        called.append(name)
    if name == "live_view":
        drawn["live"] = shown(fn, fn.fn(showcase[1], 1.8))
    if name == "compare_runs":
        drawn["compare"] = shown(fn, fn.fn(showcase, 1.8))
    if name == "history":
        drawn["history"] = shown(fn, fn.fn())

facts = {
    "called": called,
    "drawn": drawn,
    "prediction": ui.speedup_note(4, 1.0, "jagg", 1.8),
    "torch": "torch" in sys.modules,
    "diffusers": "diffusers" in sys.modules,
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "diffusers", "transformers")),
}
demo.jagg_manager.shutdown()
print("FACTS " + json.dumps(facts))
"""


@pytest.mark.slow  # a fresh interpreter imports gradio: ~20–60 s on a busy 2-core CPU
def test_app_builds_and_draws_every_page_without_torch(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "GRADIO_TEMP_DIR": str(tmp_path / "gradio"),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("SPACE_ID", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "runs"), json.dumps(LAUNCHES)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("FACTS "))
    facts = json.loads(line.removeprefix("FACTS "))
    # Every tab's handlers ran on real rows, and drew what a user sees.
    assert {
        "predict_speedup", "live_view", "on_tick", "on_load", "compare_runs", "history", "export_run",
        "cancel_run", "resume_run", "delete_run", "try_it", "try_it_cancel", "export_model",
    } <= set(facts["called"])  # fmt: skip
    live, compare, history = (facts["drawn"][k] for k in ("live", "compare", "history"))
    assert live["plots_with_traces"] >= 2 and live["images"] >= 1 and live["rows"] >= 1, live
    assert compare["plots_with_traces"] == 2 and compare["images"] >= 2 and compare["rows"] >= 2, compare
    assert history["rows"] == 3, history
    assert "1.29×" in facts["prediction"]  # the cost model (7.2 / 5.6), read without torch
    assert facts["heavy"] == [] and not facts["torch"] and not facts["diffusers"], facts["heavy"]


def test_the_app_modules_and_the_cost_model_import_without_torch() -> None:
    """The quick form of the check above: every module of the app package, and the engine modules it reads,
    imported alone."""
    code = (
        "import importlib, pkgutil, sys\nimport app\n"
        "mods = ['jagg_engine.cost', 'jagg_engine.store', 'jagg_engine.train.config', 'launch']\n"
        "mods += ['app.' + m.name for m in pkgutil.iter_modules(app.__path__)]\n"
        "for m in mods: importlib.import_module(m)\n"
        "print(len(mods), sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers')))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, heavy = proc.stdout.strip().split(" ", 1)
    assert int(count) >= 10 and heavy == "[]", proc.stdout

"""The showcase: packing a recorded pair of runs, loading it into a runs folder (once, read-only in the app),
and the shipped one in assets/showcase."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from app import data, showcase
from jagg_engine.store import open_store, reindex
from jagg_engine.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["red circle left", "blue square top", "green triangle center"]


def _recorded(runs: Path, eval_steps: tuple[int, ...] = (0, 2), prefix: str = "showcase-") -> dict[str, int]:
    """Two finished 2-step runs like `jagg train` leaves them: metrics, eval images at ``eval_steps``, a
    checkpoint and a log (which the showcase must not take)."""
    store = open_store(runs)
    ids = {}
    rng = np.random.default_rng(0)
    for strategy in ("exact", "jagg"):
        run_dir = runs / f"run-{len(ids) + 1:04d}"
        run_id = store.create_run(
            f"{prefix}{strategy}", {"strategy": strategy, "steps": 2, "output_dir": str(runs)}, run_dir
        )
        store.set_status(run_id, "running", pid=1)
        for step in range(3):
            metrics = {"reward/mean": 1.0 + step / 10, "time/update": 2.0, "lr": math.nan}
            store.log_step(run_id, step, {**metrics, "time/unix": 1.7e9 + step})
        for step in eval_steps:
            samples = []
            for i, prompt in enumerate(PROMPTS):
                for seed in (0, 1):
                    rel = f"samples/eval/step_{step:05d}/{i:03d}_seed{seed}.png"
                    (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(run_dir / rel)
                    samples.append(
                        {"kind": "eval", "prompt": prompt, "seed": seed, "reward": 0.5, "path": rel}
                    )
            store.log_samples(run_id, step, samples)
        store.log_probes(
            run_id, 1, [{"group_index": 0, "t_start": 1.0, "t_end": 0.7, "cosine": 0.9, "rel_error": 0.1}]
        )
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "step_00002.pt").write_bytes(b"weights")
        (run_dir / "train.log").write_text("log\n")
        store.set_status(run_id, "finished")
        ids[strategy] = run_id
    store.close()
    return ids


def test_pack_then_install_gives_the_same_history(tmp_path):
    ids = _recorded(tmp_path / "recorded")
    with open_store(tmp_path / "recorded") as store:
        manifest = showcase.pack(store, ids, tmp_path / "showcase")
        source = {k: (store.get_run(i), store.metrics_frame(i), store.samples(i)) for k, i in ids.items()}
    shipped = sorted(p.name for p in (tmp_path / "showcase").rglob("*") if p.is_file())
    assert shipped == [
        "exact-eval-00000.png",
        "exact-eval-00002.png",
        "jagg-eval-00000.png",
        "jagg-eval-00002.png",
        "showcase.json",
    ]  # fmt: skip  (no checkpoint, no log)
    assert json.loads(manifest.read_text())["runs"][0]["config"]["output_dir"] == "runs"

    runs = tmp_path / "fresh"
    with open_store(runs) as store:
        installed = showcase.install(store, runs, tmp_path / "showcase")
        assert len(installed) == 2
        for (key, (run, frame, samples)), run_id in zip(source.items(), installed):
            got = store.get_run(run_id)
            assert (got["name"], got["status"], got["config"]["strategy"]) == (run["name"], "finished", key)
            assert (got["started_at"], got["finished_at"]) == (run["started_at"], run["finished_at"])
            assert store.metrics_frame(run_id).equals(frame)
            assert len(store.probes(run_id)) == 1
            got_samples = store.samples(run_id)
            assert [(s["path"], s["prompt"], s["seed"]) for s in got_samples] == [
                (s["path"], s["prompt"], s["seed"]) for s in samples
            ]
            for s in got_samples:  # pixel for pixel
                original = np.asarray(Image.open(Path(run["run_dir"]) / s["path"]))
                assert np.array_equal(np.asarray(Image.open(Path(got["run_dir"]) / s["path"])), original)
        assert store.get_run(installed[1])["paired_run_id"] == installed[0]
        # Installing again is a no-op; after its rows are deleted it comes back.
        assert showcase.install(store, runs, tmp_path / "showcase") == installed
        store.delete_run(installed[0])
        again = showcase.install(store, runs, tmp_path / "showcase")
        assert len(again) == 2 and not set(again) & set(installed)
        assert {r["id"] for r in store.list_runs()} == set(again)


def _packed(tmp_path: Path) -> Path:
    ids = _recorded(tmp_path / "recorded")
    with open_store(tmp_path / "recorded") as store:
        showcase.pack(store, ids, tmp_path / "showcase")
    return tmp_path / "showcase"


def test_reindex_keeps_the_showcase_and_a_users_new_runs_never_become_it(tmp_path):
    """The reported steps: the app installs the showcase on a fresh runs folder, `jagg reindex`, two runs are
    trained, the app starts again. The showcase keeps its rows and ids; the user's runs take new ids and are
    never named the showcase."""
    shipped = _packed(tmp_path)
    runs = tmp_path / "runs"
    with open_store(runs) as store:
        installed = showcase.install(store, runs, shipped)
        before = {i: (store.get_run(i)["uid"], store.metrics_frame(i)) for i in installed}
    report = reindex(runs)
    assert sorted(report.runs) == sorted(installed)
    with open_store(runs) as store:
        mine = [store.create_run_folder(f"mine-{k}", {"name": f"mine-{k}"})[0] for k in range(2)]
        assert not set(mine) & set(installed)  # no showcase id handed out again
        again = showcase.install(store, runs, shipped)
        assert again == installed and not set(again) & set(mine)
        for run_id, (uid, frame) in before.items():
            run = store.get_run(run_id)
            assert run["uid"] == uid and store.metrics_frame(run_id).equals(frame)
            assert Path(run["run_dir"]).is_relative_to((runs / showcase.INSTALL_DIR).resolve())
        assert {store.get_run(i)["name"] for i in mine} == {"mine-0", "mine-1"}


def test_a_showcase_record_naming_a_users_runs_is_not_believed(tmp_path):
    """installed.json naming ids that are the user's runs now (their showcase rows gone, the ids taken again):
    the showcase is installed anew beside them, and the user's runs are kept as they are."""
    shipped = _packed(tmp_path)
    runs = tmp_path / "runs"
    with open_store(runs) as store:
        installed = showcase.install(store, runs, shipped)
        marker = runs / showcase.INSTALL_DIR / showcase.MARKER
        record = json.loads(marker.read_text())
        mine = [store.create_run_folder(f"mine-{k}", {"name": f"mine-{k}"})[0] for k in range(2)]
        for run_id in mine:
            store.set_status(run_id, "running", pid=None)
            store.set_status(run_id, "finished")
        for variant in (
            {**record, "ids": mine},
            {"digest": record["digest"], "ids": mine},
        ):  # with, without uids
            marker.write_text(json.dumps(variant))
            again = showcase.install(store, runs, shipped)
            assert len(again) == 2 and not set(again) & set(mine)
            assert [store.get_run(i)["name"] for i in mine] == ["mine-0", "mine-1"]
            assert json.loads(marker.read_text())["ids"] == again
        assert store.get_run(installed[0]) is None  # the replaced showcase's rows, not the user's


def test_pack_keeps_a_longer_runs_first_steps_and_thins_its_images(tmp_path):
    ids = _recorded(tmp_path / "recorded", eval_steps=(0, 1, 2))
    with open_store(tmp_path / "recorded") as store:
        cut = json.loads(showcase.pack(store, ids, tmp_path / "cut", max_step=1).read_text())
        thin = json.loads(showcase.pack(store, ids, tmp_path / "thin", image_every=5).read_text())
        whole = {k: store.get_run(i)["finished_at"] for k, i in ids.items()}
    for entry in cut["runs"]:
        assert {step for step, _, _ in entry["metrics"]} == {0, 1}
        assert {s["step"] for s in entry["samples"]} == {0, 1} and entry["probes"][0]["step"] == 1
        assert (entry["config"]["steps"], entry["cut_at_step"]) == (1, 1)
        assert entry["finished_at"] == 1.7e9 + 1 != whole[entry["key"]]
    for entry in thin["runs"]:  # the first and the last eval's images; every eval metric
        assert {s["step"] for s in entry["samples"]} == {0, 2} and "cut_at_step" not in entry
        assert entry["config"]["steps"] == 2 and entry["finished_at"] == whole[entry["key"]]
    assert sorted(p.name for p in (tmp_path / "thin" / "images").iterdir()) == [
        "exact-eval-00000.png", "exact-eval-00002.png", "jagg-eval-00000.png", "jagg-eval-00002.png"
    ]  # fmt: skip
    with open_store(tmp_path / "fresh") as store:
        runs = [store.get_run(i) for i in showcase.install(store, tmp_path / "fresh", tmp_path / "cut")]
        assert [(r["status"], r["last_step"], r["config"]["steps"]) for r in runs] == [("finished", 1, 1)] * 2
    with open_store(tmp_path / "recorded") as store, pytest.raises(ValueError, match="image_every"):
        showcase.pack(store, ids, tmp_path / "bad", image_every=0)


def test_a_broken_showcase_loads_nothing(tmp_path, capsys):
    (tmp_path / "showcase").mkdir()
    (tmp_path / "showcase" / "showcase.json").write_text('{"format": 1, "runs": [{"key": "x"}]}')
    with open_store(tmp_path / "runs") as store:
        assert showcase.install(store, tmp_path / "runs", tmp_path / "showcase") == []
        assert store.list_runs() == []
    assert "the showcase was not loaded" in capsys.readouterr().out
    with open_store(tmp_path / "runs2") as store:
        assert showcase.install(store, tmp_path / "runs2", tmp_path / "missing") == []


def test_side_by_side_at_first_and_last_eval(tmp_path):
    ids = _recorded(tmp_path)
    with open_store(tmp_path) as store:
        items = data.side_by_side_first_last(store, [ids["exact"], ids["jagg"]], tmp_path, limit_keys=2)
    # 6 prompt+seed pairs, 2 spread over them (every third): rows of exact@0, jagg@0, exact@2, jagg@2.
    assert len(items) == 8
    captions = [c for _, c in items]
    assert captions[0].startswith(f"#{ids['exact']} exact · step 0 · ") and captions[3].startswith(
        f"#{ids['jagg']} jagg · step 2 · "
    )
    assert all(Path(p).is_file() for p, _ in items)
    first_row = {c.split(" · ")[2] for c in captions[:4]}
    assert len(first_row) == 1  # one prompt per row


def test_the_shipped_showcase(tmp_path):
    files = [p for p in showcase.SHOWCASE_DIR.rglob("*") if p.is_file()]
    models = showcase.SHOWCASE_DIR / showcase.MODELS
    history = sum(p.stat().st_size for p in files if not p.is_relative_to(models))
    assert history <= 3 * 1024**2, f"assets/showcase without its model is {history / 1024**2:.2f} MB"
    # the aligned model: one tiny-shapes transformer, each file under the Hub's 10 MB for a file outside LFS
    assert all(p.stat().st_size < 10 * 1024**2 for p in files if p.is_relative_to(models))
    manifest = json.loads((showcase.SHOWCASE_DIR / showcase.MANIFEST).read_text())
    exact, jagg = manifest["runs"]
    assert (exact["config"]["strategy"], jagg["config"]["strategy"]) == ("exact", "jagg")
    # Flow-GRPO's exact run (variant (a)) against the shipped default, the config's 40 steps, eval every 5;
    # same seed, prompts, eval seeds and everything else.
    windowed = ("sde_window_end", "ode_solver", "ode_steps_after")  # the default's window and solver
    differ = {k for k in exact["config"] if exact["config"][k] != jagg["config"][k]}
    assert differ == {"strategy", "name", "checkpoint_every", *windowed}, differ  # a checkpoint: its model
    assert "model" not in exact and jagg["model"]["step"] == jagg["config"]["steps"]
    info = json.loads((models / "jagg" / "jagg_run.json").read_text())
    assert info["kind"] == "tiny-shapes" and info["step"] == jagg["config"]["steps"]
    logged = [v for step, key, v in jagg["metrics"] if key == "eval/reward/mean" and step == info["step"]]
    assert info["eval_reward"]["after"]["mean"] == pytest.approx(logged[0])  # the model card's is the run's
    default = TrainConfig()
    same = ("sde_window_schedule", "group_noise", "window")  # both a fixed window, every sample its own noise
    keys = (*windowed, *same)
    assert [jagg["config"][k] for k in keys] == [getattr(default, k) for k in keys]
    assert [exact["config"][k] for k in windowed] == [8, "euler", None]  # Flow-GRPO: all of steps 0-7
    for run in (exact, jagg):
        assert run["config"]["steps"] == default.steps and run["config"]["eval_every"] == 5
        evals = [step for step, key, _ in run["metrics"] if key == "eval/reward/mean"]
        assert evals == list(range(0, default.steps + 1, 5))
    keys = [{(s["step"], s["prompt"], s["seed"]) for s in run["samples"]} for run in (exact, jagg)]
    assert keys[0] == keys[1] and len({k[0] for k in keys[0]}) >= 2
    with open_store(tmp_path) as store:
        ids = showcase.install(store, tmp_path)
        runs = [store.get_run(i) for i in ids]
        assert [r["status"] for r in runs] == ["finished", "finished"]
        assert all(r["last_step"] == r["config"]["steps"] for r in runs)
        assert showcase.shipped_model(runs[1]["run_dir"])[0] == jagg["config"]["steps"]
        assert showcase.shipped_model(runs[0]["run_dir"]) is None


def test_reward_svg_draws_each_runs_train_and_eval_curve(tmp_path):
    ids = _recorded(tmp_path)
    with open_store(tmp_path) as store:
        frames = {f"#{i} {k}": store.metrics_frame(i) for k, i in ids.items()}
    svg = data.reward_svg(frames)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    curves = re.findall(
        r'<polyline class="curve" data-run="([^"]+)" data-kind="(\w+)"[^>]*points="([^"]+)"', svg
    )
    assert [(run, kind) for run, kind, _ in curves] == [
        (f"#{ids['exact']} exact", "train"),
        (f"#{ids['jagg']} jagg", "train"),
    ]
    assert all(len(points.split()) == 3 for _, _, points in curves)  # steps 0, 1, 2
    assert data.reward_svg({"empty": pd.DataFrame({"step": []})}) == ""


def test_record_showcase_packs_runs_named_by_id(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("record_showcase", ROOT / "scripts" / "record_showcase.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ids = _recorded(tmp_path / "race", eval_steps=(0, 1, 2), prefix="race-")
    out = tmp_path / "out"
    argv = ["--pack-only", str(tmp_path / "race"), "--runs", f"exact={ids['exact']},jagg={ids['jagg']}"]
    argv += ["--no-model"]  # these runs have no checkpoint to export
    assert script.main([*argv, "--max-step", "1", "--recorded-with", "jagg race X", "--out", str(out)]) == 0
    manifest = json.loads((out / "showcase.json").read_text())
    assert manifest["recorded_with"] == "jagg race X"
    assert [(r["key"], r["cut_at_step"]) for r in manifest["runs"]] == [("exact", 1), ("jagg", 1)]
    # named as the app knows a showcase, the name it was recorded under kept
    assert [(r["name"], r["config"]["name"], r["recorded_as"]) for r in manifest["runs"]] == [
        ("showcase-exact", "showcase-exact", "race-exact"),
        ("showcase-jagg", "showcase-jagg", "race-jagg"),
    ]
    for bad, message in [
        (
            ["--pack-only", str(tmp_path / "race"), "--runs", "jagg=1,exact=2"],
            "--runs: must be exact=ID,jagg=ID",
        ),
        (
            ["--pack-only", str(tmp_path / "race"), "--runs", "exact=1,jagg=x"],
            "--runs: must be exact=ID,jagg=ID",
        ),
        (["--max-step", "3"], "--runs, --max-step and --recorded-with go with --pack-only"),
        (["--image-every", "0"], "--image-every: must be an integer >= 1, got 0"),
    ]:
        with pytest.raises(SystemExit) as exc:
            script.main([*bad, "--out", str(out)])
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_try_it_opens_on_the_finished_run_trained_longest_not_the_newest_test_run(tmp_path):
    """Try it's picker opens on a finished run before any other, then on the one trained the most steps: a
    one-step test run does not hide the showcase's 40-step model; a longer run of the user's comes before it."""
    from types import SimpleNamespace

    from app import tryit

    root = tmp_path / "runs"
    store = open_store(root)
    ids = showcase.install(store, root)
    shipped = showcase.shipped_model(store.get_run(ids[1])["run_dir"])
    assert shipped is not None and shipped[0] >= 2  # the JAGG run ships its model (step 40)

    def run_with_checkpoint(name: str, step: int, status: str) -> int:
        run_dir = root / name
        run_id = store.create_run(name, {"strategy": "jagg", "steps": step}, run_dir)
        store.set_status(run_id, "running", pid=1)
        store.set_status(run_id, status)
        (run_dir / "checkpoints" / f"step_{step:05d}").mkdir(parents=True)
        (run_dir / "checkpoints" / f"step_{step:05d}" / "manifest.json").write_text("{}")
        return run_id

    h = tryit.TryIt(SimpleNamespace(store=store, root=root, space=False, publish=str, showcase_ids=ids))
    smoke = run_with_checkpoint("smoke", 1, "finished")  # the newest: a one-step test run
    cut = run_with_checkpoint("cut", shipped[0] + 20, "cancelled")  # longer, but not finished
    assert [run_id for _, run_id in h.run_choices()] == [cut, smoke, ids[1]]  # the user's first, newest first
    assert h.default_run() == ids[1] and h.initial()[1:] == (ids[1], [shipped[0]])
    run_picker, step_picker = h.load_pickers()
    assert run_picker["value"] == ids[1] and step_picker["value"] == shipped[0]
    longer = run_with_checkpoint("real", shipped[0] + 10, "finished")
    assert h.default_run() == longer and h.initial()[1:] == (longer, [shipped[0] + 10])
    store.close()


def test_the_showcase_sentence_and_its_curves_are_on_one_clock_training_seconds_evals_excluded(tmp_path):
    """The first screen's sentence gives each run's training seconds (evals excluded) to reach the level; the
    static curves under it and the Compare plot it opens on have those seconds on their x axis, at the step
    the sentence names (not each run's seconds since it started, which count its evals too)."""
    from app import layout, metrics

    with open_store(tmp_path) as store:
        ids = showcase.install(store, tmp_path)
        sentence = showcase.headline(store, ids, 1.8)
        svg = showcase.curves_over_time(store, ids)
        runs = {f"#{i} {store.get_run(i)['config']['strategy']}": store.get_run(i) for i in ids}
        frames = {label: store.metrics_frame(run["id"]) for label, run in runs.items()}
    assert layout.SHOWCASE_X == "training time" and "evals excluded" in sentence, sentence
    fig = data.reward_figure(frames, x=layout.SHOWCASE_X, runs=runs)
    title = "training time (s, evals excluded)"
    assert fig.layout.xaxis.title.text == title and f">{title}</text>" in svg
    for label, frame in frames.items():
        found = re.search(rf"{re.escape(label)}(?: trains)? \*\*(\d+) s\*\* \(step (\d+)\)", sentence)
        assert found, (label, sentence)
        seconds, step = int(found.group(1)), int(found.group(2))
        evals = frame.dropna(subset=["eval/reward/mean"])
        trace = next(t for t in fig.data if t.name == f"{label} · eval")
        at = list(evals["step"]).index(step)
        assert round(trace.x[at]) == seconds, (label, trace.x[at], seconds)  # the curve's x at that step
        wall = metrics.x_values(frame, runs[label], "relative time")[evals.index[at]]
        assert wall - seconds > 10  # the relative-time axis would put that eval elsewhere (its evals)
    ticks = [float(t) for t in re.findall(r'text-anchor="middle">([\d.]+)</text>', svg)]
    last = max(float(metrics.training_seconds(f).iloc[-1]) for f in frames.values())
    assert max(ticks) == float(f"{last:.4g}")  # the static curves end at the longest run's training seconds

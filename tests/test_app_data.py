"""app/data.py on a temporary store filled with synthetic rows: figures, speedup, config diff, images."""

from __future__ import annotations

import pandas as pd
import pytest
from PIL import Image

from app import data
from jagg_engine.store import open_store
from jagg_engine.train.config import TrainConfig


def _config(**changes):
    return {**TrainConfig().to_dict(), **changes}


def _png(path, color):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), color).save(path)


@pytest.fixture
def store(tmp_path):
    """Two paired runs (exact, jagg) of 4 steps with every metric family, eval samples and probes."""
    root = tmp_path / "runs"
    s = open_store(root)
    ids = {}
    for strategy, update_s in (("exact", 2.0), ("jagg", 1.0)):
        run_id = s.create_run(f"t-{strategy}", _config(strategy=strategy, steps=4), root / f"run-{strategy}")
        ids[strategy] = run_id
        s.set_status(run_id, "running", pid=None)
        for step in range(4):
            s.log_step(
                run_id,
                step,
                {
                    "reward/mean": 0.1 * step,
                    "reward/std": 0.05,
                    "reward/shapes-dense/mean": 0.1 * step,
                    "time/sampling": 0.5,
                    "time/reward": 0.1,
                    "time/update_forward": update_s / 2,
                    "time/update_backward": update_s / 2,
                    # the first step pays warm-up; the median of the others is what counts
                    "time/update": update_s * (5 if step == 0 else 1),
                    "count/forward": 8,
                    "count/backward": 8 if strategy == "exact" else 4,
                },
            )
        for step in (0, 3):
            s.log_step(run_id, step, {"eval/reward/mean": 0.2 + 0.1 * step})
            rows = []
            for seed in (0, 1):
                rel = f"samples/eval/step{step}-p0-s{seed}.png"
                _png(root / f"run-{strategy}" / rel, (255, 0, 0))
                rows.append(
                    {"kind": "eval", "prompt": "a red circle", "seed": seed, "reward": 0.5, "path": rel}
                )
            s.log_samples(run_id, step, rows)
        s.set_status(run_id, "finished")
    s.set_paired(ids["jagg"], ids["exact"])
    s.log_probes(
        ids["jagg"],
        2,
        [
            {"group_index": g, "t_start": 1.0, "t_end": 0.5, "cosine": c, "rel_error": 0.1}
            for g, c in enumerate((0.9, 0.6))
        ],
    )
    yield s, ids, root
    s.close()


def test_reward_figure_has_mean_with_std_in_hover_and_eval_per_reward(store):
    s, ids, _ = store
    fig = data.reward_figure({"jagg": s.metrics_frame(ids["jagg"])})
    names = [t.name for t in fig.data]
    assert names == ["jagg · total", "jagg · eval"]  # one reward; 4 steps: no trend line
    lo, hi = fig.layout.yaxis.range
    assert lo < 0.0 and 0.5 < hi < 0.6  # fitted to the lines (0 … 0.5)
    mean = fig.data[0]
    assert list(mean.y) == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert list(mean.customdata) == pytest.approx([0.05] * 4) and "%{customdata" in mean.hovertemplate
    assert list(fig.data[1].x) == [0, 3] and list(fig.data[1].y) == pytest.approx([0.2, 0.5])
    two = pd.DataFrame(
        {"step": [1, 2], "reward/mean": [1.0, 2.0], "reward/a/mean": [0.5, 1.0], "reward/b/mean": [2, 3]}
    )
    assert [t.name for t in data.reward_figure({"": two}).data] == ["total", "a", "b"]


def test_reward_figure_trend_is_a_trailing_mean_from_step_5():
    frame = pd.DataFrame({"step": list(range(1, 13)), "reward/mean": [float(i) for i in range(1, 13)]})
    (mean, trend) = data.reward_figure({"": frame}).data
    assert trend.name == "total, mean of last 10 steps" and list(trend.x) == list(range(1, 13))
    y = list(trend.y)
    assert all(v != v for v in y[:4])  # NaN: fewer than 5 steps averaged
    assert y[4:] == pytest.approx([3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.5, 7.5])


def test_reward_figure_overlays_runs(store):
    s, ids, _ = store
    fig = data.reward_figure({k: s.metrics_frame(v) for k, v in ids.items()})
    assert {t.name for t in fig.data} >= {"exact · total", "jagg · total", "exact · eval", "jagg · eval"}
    empty = data.reward_figure({"x": s.metrics_frame(9999)})
    assert not empty.data and "no data" in empty.layout.annotations[0].text


def test_time_breakdown_is_stacked_by_phase(store):
    s, ids, _ = store
    fig = data.time_breakdown_figure(s.metrics_frame(ids["exact"]))
    assert fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["sampling", "reward", "update forward", "update backward"]
    assert list(fig.data[3].y) == pytest.approx([1.0] * 4)


def test_pass_counts_and_probe_figures(store):
    s, ids, _ = store
    counts = data.pass_counts_figure(s.metrics_frame(ids["jagg"]))
    assert [t.name for t in counts.data] == ["forward", "backward"]
    assert list(counts.data[1].y) == [4, 4, 4, 4]
    probes = data.probe_figure(s.probes(ids["jagg"]))
    assert [t.name for t in probes.data] == ["jagg @ step 2"]
    assert list(probes.data[0].y) == pytest.approx([0.9, 0.6])
    assert not data.probe_figure([]).data
    routed = data.probe_figure(s.probes(ids["jagg"]), route_frac=0.5, threshold=0.7)
    assert "routed to JAGG: groups 0–0 of 2" in routed.layout.title.text
    assert routed.layout.shapes[0].y0 == 0.7


def test_speedup_measured_against_the_paired_exact_run(store):
    s, ids, _ = store
    row = data.speedup_frame(s, ids["jagg"], r=1.8).iloc[0]
    # medians without the warm-up step: exact 2.0 s, jagg 1.0 s
    assert row["exact update s/step"] == pytest.approx(2.0)
    assert row["update s/step"] == pytest.approx(1.0)
    assert row["measured speedup"] == pytest.approx(2.0)
    # defaults: 8 trained steps, W = 4, f = 1, the rollout's velocities reused → 2 groups of 4: 7.2 / 3.6
    assert row["predicted speedup"] == pytest.approx(7.2 / 3.6, abs=1e-3)
    assert row["paired exact run"] == f"#{ids['exact']}"
    # the link works both ways: the exact run finds no exact partner and reports no measured speedup
    assert data.speedup_frame(s, ids["exact"], r=1.8).iloc[0]["measured speedup"] is None


def test_config_speedup_counts_the_control_variate_and_a_switch_to_exact():
    cfg = {"window": 4, "jagg_frac": 1.0, "strategy": "jagg", "sampling_steps": 12, "sde_window_end": 4,
           "reuse_rollout_velocity": "auto", "steps": 70}  # fmt: skip
    assert data.config_speedup(cfg, 1.8) == pytest.approx(7.2 / 3.6)
    cfg["cv_frac"] = 0.25  # a quarter of the inner steps' pairs by the exact backward too: 3.6 + 0.25·2·1.8
    assert data.config_speedup(cfg, 1.8) == pytest.approx(7.2 / 4.5)
    cfg.update(cv_frac=0.0, jagg_until_step=40)  # JAGG for 40 of 70 steps at 2×, exact after: 70 / (20 + 30)
    assert data.config_speedup(cfg, 1.8) == pytest.approx(1.4)
    assert data.switched_speedup(2.0, 70, None) == data.switched_speedup(2.0, 70, 70) == 2.0
    # exact for 20 steps, JAGG for 50 at 2×: 70 / (20 + 25)
    cfg.update(jagg_until_step=None, jagg_from_step=20)
    assert data.config_speedup(cfg, 1.8) == pytest.approx(70 / 45)
    cfg.update(jagg_until_step=40)  # exact, JAGG on steps 21-40, exact: 70 / (50 + 10)
    assert data.config_speedup(cfg, 1.8) == pytest.approx(70 / 60)
    cfg["strategy"] = "exact"  # an exact run has no switch to make
    assert data.config_speedup(cfg, 1.8) == pytest.approx(1.0)


def test_predicted_speedup_formula():
    assert data.predicted_speedup(4, 1.8, 1.0) == pytest.approx(7.2 / 5.6)
    assert data.predicted_speedup(4, 3.0, 0.5) == pytest.approx(12 / (0.5 * 8 + 0.5 * 12))
    assert data.predicted_speedup(4, 3.0, 0.0) == pytest.approx(1.0)
    assert data.predicted_speedup(4, 3.0, 1.0, strategy="exact") == 1.0
    # velocity reuse: a JAGG group costs 2r on the first of the updates_per_rollout mini-batches
    assert data.predicted_speedup(4, 1.8, 1.0, reuse=True) == pytest.approx(7.2 / 3.6)
    assert data.predicted_speedup(4, 1.8, 1.0, reuse=True, updates_per_rollout=2) == pytest.approx(7.2 / 4.6)
    assert data.predicted_speedup(4, 1.8, 1.0, strategy="endpoint", reuse=True) == pytest.approx(7.2 / 3.6)


def test_config_speedup_reads_reuse_and_minibatches():
    cfg = {"window": 4, "jagg_frac": 1.0, "strategy": "jagg", "sampling_steps": 12, "sde_window_end": 8}
    assert data.config_speedup(cfg, 1.8) == pytest.approx(7.2 / 5.6)  # a config from before reuse: none
    cfg["reuse_rollout_velocity"] = "auto"
    assert data.config_speedup(cfg, 1.8) == pytest.approx(7.2 / 3.6)
    cfg["updates_per_rollout"] = 4
    assert data.config_speedup(cfg, 1.8) == pytest.approx(7.2 / (0.25 * 3.6 + 0.75 * 5.6))
    # a sliding window trains W = 4 of the 8 steps a step, one group: the same ratio as one fixed window of 4
    cfg.update(updates_per_rollout=1, window=4, sde_window_schedule="sliding")
    assert data.config_speedup(cfg, 1.8) == pytest.approx(7.2 / 3.6)
    cfg.update(window=3, reuse_rollout_velocity="off")  # W = 3 of 8: one group of 3, (3·r) / (1 + 2r)
    assert data.config_speedup(cfg, 1.8) == pytest.approx(3 * 1.8 / (1 + 2 * 1.8))
    cfg["sde_window_schedule"] = "fixed"  # fixed: the 8 steps in groups 3, 3, 2 (the last one exact)
    assert data.config_speedup(cfg, 1.8) == pytest.approx(8 * 1.8 / (2 * (1 + 2 * 1.8) + 2 * 1.8))
    # Against an exact run that trains another number of steps a step, its own cost: Flow-GRPO's 8 steps (8r)
    # against a sliding W = 4 with reuse (2r) is 4x; MixGRPO's sliding exact (4r) against Flow-GRPO's is 0.5x
    flow_grpo = {**cfg, "strategy": "exact", "window": 4}
    windowed = {
        **flow_grpo,
        "strategy": "jagg",
        "sde_window_schedule": "sliding",
        "reuse_rollout_velocity": "auto",
    }
    assert data.config_speedup(windowed, 1.8, flow_grpo) == pytest.approx(8 * 1.8 / (2 * 1.8))
    assert data.config_speedup(flow_grpo, 1.8, {**windowed, "strategy": "exact"}) == pytest.approx(4 / 8)
    assert data.config_speedup(windowed, 1.8, {**windowed, "strategy": "exact"}) == pytest.approx(2.0)


def test_compare_frame_and_config_diff(store):
    s, ids, _ = store
    table = data.compare_frame(s, [ids["exact"], ids["jagg"]], r=1.8)
    # the exact run is the baseline (no speedup of its own); the jagg run against its pair, both ended
    assert table["speedup vs exact"].isna().iloc[0] and table["speedup vs exact"].iloc[1] == pytest.approx(
        2.0
    )
    assert list(table["exact run"]) == ["-", f"#{ids['exact']} (paired)"]
    assert list(table["speedup status"]) == ["-", "final: both runs ended"]
    assert "measured" not in table.columns  # a column named so held the word "final"
    assert list(table["update time (s)"]) == pytest.approx([2.0 * 8, 1.0 * 8])
    assert list(table["final reward"]) == pytest.approx([0.5, 0.5])
    runs = {f"#{i}": s.get_run(i)["config"] for i in ids.values()}
    diff = data.config_diff(runs)
    assert list(diff["field"]) == ["strategy"]
    assert list(diff.iloc[0][1:]) == ["exact", "jagg"]
    assert data.config_diff({"a": {"x": 1}, "b": {"x": 1}}).empty


def test_history_frame(store):
    s, ids, _ = store
    hist = data.history_frame(s)
    assert list(hist["id"]) == [ids["jagg"], ids["exact"]]
    first = hist.iloc[0]
    assert (first["status"], first["backbone"], first["W"], first["strategy"]) == (
        "finished",
        "tiny-shapes",
        4,
        "jagg",
    )
    assert first["final reward"] == pytest.approx(0.5)
    assert first["step"] == "3/4" and first["duration"].endswith(" s")
    # a run paired with another shows its id as an integer, never "10.0"
    assert str(hist["paired"].dtype) == "Int64"


def test_history_durations_filters_and_notes(store, tmp_path):
    from app import notes

    s, ids, _ = store
    assert [data.human_duration(x) for x in (None, 4.4, 65, 3 * 3600 + 4 * 60 + 9)] == [
        "", "4 s", "1 min 05 s", "3 h 04 min",
    ]  # fmt: skip
    notes.set_note(tmp_path, ids["exact"], "the baseline, lr 1e-4")
    hist = data.history_frame(s, notes.read_notes(tmp_path))
    assert hist.set_index("id").at[ids["exact"], "note"] == "the baseline, lr 1e-4"
    assert list(data.filter_history(hist, "BASELINE")["id"]) == [ids["exact"]]  # name or note, any case
    assert list(data.filter_history(hist, strategy="jagg")["id"]) == [ids["jagg"]]
    assert list(data.filter_history(hist, status="all", backbone="tiny-shapes")["id"]) == list(hist["id"])
    assert data.filter_history(hist, "baseline", strategy="jagg").empty
    with pytest.raises(ValueError, match="filter: must be one of status, backbone, strategy, got 'lr'"):
        data.filter_history(hist, lr="1")
    notes.set_note(tmp_path, ids["exact"], "")  # empty text removes the note
    assert notes.read_notes(tmp_path) == {}
    with pytest.raises(notes.NoteError, match="note: at most 2000 characters"):
        notes.set_note(tmp_path, ids["exact"], "x" * 2001)


def test_gallery_items_newest_first_with_captions(store):
    s, ids, root = store
    items = data.gallery_items(s, ids["jagg"], root)
    assert len(items) == 4
    path, caption = items[0]
    assert "step3" in path and caption == "step 3 · a red circle · seed 0 · reward 0.500"


def test_gallery_refuses_paths_outside_the_runs_folder(store, tmp_path):
    s, ids, root = store
    outside = tmp_path / "secret.png"
    _png(outside, (0, 0, 0))
    run_dir = root / "run-jagg"
    (run_dir / "link.png").symlink_to(outside)
    s.log_samples(ids["jagg"], 5, [{"kind": "eval", "prompt": "x", "seed": 0, "path": "link.png"}])
    paths = [p for p, _ in data.gallery_items(s, ids["jagg"], root)]
    assert all(str(root.resolve()) in p for p in paths) and not any(
        "link" in p or "secret" in p for p in paths
    )
    assert data.safe_image_path(run_dir, "link.png", root) is None
    assert data.safe_image_path(tmp_path, "secret.png", root) is None
    assert data.safe_image_path(run_dir, "samples/eval/step0-p0-s0.png", root) is not None


def test_side_by_side_pairs_same_prompt_and_seed(store):
    s, ids, root = store
    items = data.side_by_side(s, [ids["exact"], ids["jagg"]], root)
    assert len(items) == 4
    captions = [c for _, c in items]
    assert captions[0].startswith(f"#{ids['exact']} exact") and captions[1].startswith(f"#{ids['jagg']} jagg")
    assert "seed 0" in captions[0] and "seed 0" in captions[1] and "seed 1" in captions[2]
    assert all("step 3" in c for c in captions)


def test_progress_and_log_tail(store, tmp_path):
    s, ids, _ = store
    run = s.get_run(ids["jagg"])
    assert data.progress(run) == (4, 4)
    assert "100 %" in data.progress_markdown(run)
    run_dir = tmp_path / "logs"
    run_dir.mkdir()
    (run_dir / "stdout.log").write_text("boot\n")
    assert data.log_tail(run_dir) == "boot"
    (run_dir / "train.log").write_text("\n".join(f"line {i}" for i in range(100)))
    assert data.log_tail(run_dir, lines=2) == "line 98\nline 99"
    assert data.log_tail(run_dir, stdout=True) == "boot"


# ---------------------------------------------------------------------------------------------- a fast timer


def _count_calls(monkeypatch, owner, name):
    calls = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_open_tabs_share_one_read_per_tick(store, monkeypatch):
    s, ids, _ = store
    list_calls = _count_calls(monkeypatch, s, "list_runs")
    count_calls = _count_calls(monkeypatch, s, "sample_count")
    queue = []
    now = [0.0]
    shared = data.SharedTick(s, lambda: queue.append(now[0]), max_age=1.0, clock=lambda: now[0])

    def tab(run_id):  # what each tab's timer reads
        shared.tick()
        return shared.signature(run_id), [r["id"] for r in shared.runs()]

    first = [tab(ids["jagg"]) for _ in range(5)] + [tab(ids["exact"])]
    assert (len(queue), len(list_calls), len(count_calls)) == (1, 1, 2)  # 6 tabs, two runs watched
    assert all(f == first[0] for f in first[:5]) and first[0][0][0] == ids["jagg"]
    now[0] = 1.5  # the next tick reads again, once
    assert tab(ids["jagg"]) == first[0] and tab(ids["jagg"]) == first[0]
    assert (len(queue), len(list_calls), len(count_calls)) == (2, 2, 3)
    s.log_samples(ids["jagg"], 9, [{"kind": "eval", "prompt": "x", "seed": 0, "path": "samples/x.png"}])
    now[0] = 3.0
    assert tab(ids["jagg"])[0] != first[0][0]  # a new sample changes the signature


def test_the_app_timer_work_does_not_grow_with_open_tabs(tmp_path, monkeypatch):
    from app import ui

    demo = ui.build_app(tmp_path / "runs", background_ticks=False)
    try:
        manager, shared = demo.jagg_manager, demo.jagg_shared
        run_id = manager.store.create_run("r", _config(), tmp_path / "runs" / "run-0001")
        manager.store.set_status(run_id, "cancelled")
        on_tick = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", None) == "on_tick")
        reads = _count_calls(monkeypatch, manager.store, "list_runs")
        clock = [0.0]
        shared.clock = lambda: clock[0]
        first = on_tick(run_id, 1.8, None, None)  # a tab draws the run once
        assert first[0].startswith(f"**Run #{run_id} r**")
        seen, list_seen = first[-3], first[-1]
        per_tick = []
        for tabs in (1, 6):
            clock[0] += 10  # a new tick with nothing new: every tab skips every output
            before = len(reads)
            for _ in range(tabs):
                outputs = on_tick(run_id, 1.8, seen, list_seen)
                assert all(type(o).__name__ == "skip" or o == {"__type__": "update"} for o in outputs[:8])
            per_tick.append(len(reads) - before)
        assert per_tick[0] == per_tick[1] > 0, per_tick
    finally:
        demo.jagg_manager.shutdown()


def test_missing_images_are_skipped_at_once(store, monkeypatch):
    import shutil

    s, ids, root = store
    rows = [
        {"kind": "eval", "prompt": f"p{i}", "seed": 0, "path": f"samples/eval/gone-{i}.png"}
        for i in range(300)
    ]
    s.log_samples(ids["jagg"], 7, rows)  # 300 rows whose files were never written
    from jagg_engine.report import images  # where RunImages, which the gallery reads through, lives

    safe = _count_calls(monkeypatch, images, "safe_image_path")
    listings = _count_calls(monkeypatch, data.os, "scandir")
    items = data.gallery_items(s, ids["jagg"], root)
    assert [c.split(" · ")[0] for _, c in items] == ["step 3"] * 2 + ["step 0"] * 2  # the 4 real images
    assert len(safe) == 4 and len(listings) == 1  # one listing of samples/eval, no lookup per missing file

    shutil.rmtree(root / "run-jagg")  # the whole run folder is gone
    del safe[:], listings[:]
    assert data.gallery_items(s, ids["jagg"], root) == []
    assert data.side_by_side(s, [ids["jagg"], ids["exact"]], root) == []
    assert (len(safe), len(listings)) == (0, 0)


def test_window_panel_draws_the_window_sigmas_on_a_sigma_axis():
    import pandas as pd

    from app import metrics

    frame = pd.DataFrame(
        {
            "step": [1, 2, 3],
            "sampler/window_start": [0.0, 1.0, 2.0],
            "sampler/window_end": [4.0, 5.0, 6.0],
            "sampler/sigma_window_start": [1.0, 0.99, 0.98],
            "sampler/sigma_window_end": [0.93, 0.83, 0.61],
        }
    )
    fig = metrics.window_figure(frame, 12)
    sigma = [t for t in fig.data if t.yaxis == "y2"]
    assert [t.name for t in sigma] == ["σ at start", "σ after end"]
    assert list(sigma[1].y) == [0.93, 0.83, 0.61] and fig.layout.yaxis2.title.text == "σ"
    older = metrics.window_figure(frame.drop(columns=list(metrics.SIGMA_KEYS)), 12)  # a history without σ
    assert all(t.yaxis in (None, "y") for t in older.data) and len(older.data) == 2


def test_trained_steps_of_a_random_or_one_step_window():
    base = {"sampling_steps": 12, "sde_window_start": 0, "sde_window_end": 8, "algorithm": "flow-grpo"}
    assert data.trained_steps({**base, "sde_window_schedule": "random", "window": 1}) == 1
    assert data.trained_steps({**base, "sde_window_schedule": "sliding", "window": 4}) == 4
    assert data.trained_steps({**base, "sde_window_schedule": "fixed", "window": 4}) == 8


def _timed_run(s, root, name, strategy, update_s, status="finished", **config):
    run_id = s.create_run(name, _config(strategy=strategy, steps=4, **config), root / name)
    s.set_status(run_id, "running", pid=None)
    for step in range(1, 4):
        s.log_step(run_id, step, {"time/update": update_s, "time/train_elapsed": 10.0 * step})
    if status != "running":
        s.set_status(run_id, status)
    return run_id


def test_each_jagg_run_is_measured_against_its_own_exact_run_never_the_first_one_picked(store):
    s, ids, root = store
    # A second batch size: an exact run of group 4 and an unpaired JAGG run of group 4 still training.
    exact4 = _timed_run(s, root, "exact-g4", "exact", 4.0, group_size=4)
    jagg4 = _timed_run(s, root, "jagg-g4", "jagg", 1.0, status="running", group_size=4)
    lonely = _timed_run(s, root, "jagg-p9", "jagg", 1.0, prompts_per_step=9)  # no exact run of its batch
    picked = [ids["exact"], ids["jagg"], exact4, jagg4, lonely]
    table = data.compare_frame(s, picked, r=1.8).set_index(pd.Index(picked))
    assert table.at[ids["jagg"], "speedup vs exact"] == pytest.approx(2.0)  # its pair: 2.0 / 1.0
    assert table.at[ids["jagg"], "exact run"] == f"#{ids['exact']} (paired)"
    assert table.at[jagg4, "speedup vs exact"] == pytest.approx(4.0)  # never #1's 2.0 / 1.0
    assert table.at[jagg4, "exact run"] == f"#{exact4} (same batch and eval)"
    assert table.at[jagg4, "speedup status"] == f"provisional: #{jagg4} running"
    assert table.at[lonely, "speedup vs exact"] != table.at[lonely, "speedup vs exact"]  # NaN: no baseline
    assert table.at[lonely, "exact run"] == "-" and table.at[lonely, "speedup status"] == "-"
    run = s.get_run(jagg4)
    assert data.speedup_baseline(s, run, [s.get_run(i) for i in picked])[0]["id"] == exact4
    assert data.speedup_baseline(s, s.get_run(exact4), [run]) == (None, "")


def test_a_pairs_speedup_is_provisional_until_both_runs_end(store):
    s, ids, root = store
    exact = _timed_run(s, root, "e", "exact", 3.0, status="running")
    jagg = _timed_run(s, root, "j", "jagg", 1.0)  # JAGG ends first
    s.set_paired(jagg, exact)
    row = data.speedup_frame(s, jagg, r=1.8).iloc[0]
    assert (
        row["measured speedup"] == pytest.approx(3.0)
        and row["speedup status"] == f"provisional: #{exact} running"
    )
    for step in (4, 5):  # the exact run's later steps move the number until it ends
        s.log_step(exact, step, {"time/update": 5.0})
    s.set_status(exact, "finished")
    row = data.speedup_frame(s, jagg, r=1.8).iloc[0]
    assert (
        row["measured speedup"] == pytest.approx(4.0) and row["speedup status"] == "final: both runs ended"
    )  # median of 3,3,5,5


def test_the_live_view_of_a_jagg_run_that_ended_is_redrawn_while_its_exact_run_trains(store):
    s, ids, root = store
    exact = _timed_run(s, root, "e", "exact", 3.0, status="running")
    jagg = _timed_run(s, root, "j", "jagg", 1.0)
    s.set_paired(jagg, exact)
    now = [0.0]
    shared = data.SharedTick(s, max_age=1.0, clock=lambda: now[0])
    before = shared.signature(jagg)
    assert before[-4:] == ("pair", exact, "running", 3)
    s.log_step(exact, 4, {"time/update": 5.0})  # the JAGG run itself did not change
    now[0] = 2.0
    assert shared.signature(jagg) != before and shared.signature(jagg)[-1] == 4
    assert data.pair_signature(s.get_run(ids["exact"]), s.list_runs())[1] == ids["jagg"]  # linked either way


def test_predictions_say_which_exact_run_they_are_over():
    windowed = _config(
        strategy="jagg", sde_window_schedule="sliding", window=4, reuse_rollout_velocity="auto"
    )
    flow_grpo = _config(
        strategy="exact",
        sde_window_schedule="fixed",
        sde_window_start=0,
        sde_window_end=None,
        sampling_steps=12,
    )
    same = data.prediction_baseline(windowed, {**windowed, "strategy": "exact"})
    assert same == "exact backward over the same 4 trained steps" == data.prediction_baseline(windowed, None)
    whole = data.prediction_baseline(windowed, flow_grpo)
    assert (
        whole == f"exact backward over its {data.trained_steps(flow_grpo)} trained steps (this run trains 4)"
    )
    from app.form import FORM_BASELINE, speedup_note

    # the form says it the same way, without the count it cannot know before the overrides are read
    assert FORM_BASELINE == "exact backward over the same trained steps" and same.startswith(
        FORM_BASELINE[:29]
    )
    assert f"over {FORM_BASELINE}: **" in speedup_note(4, 1.0, "jagg", 1.8)


def test_durations_count_training_time_not_a_resumed_runs_idle_time(store):
    s, _, root = store
    run_id = _timed_run(s, root, "resumed", "jagg", 1.0)  # 30 s of training by its clock
    s.set_times(run_id, 1000.0, 1000.0, 1000.0 + 86400)  # first started a day before it finished
    run = s.get_run(run_id)
    last = s.last_values(run_id, data.TRAINING_CLOCK_KEYS)
    assert data.run_duration(run) == 86400 and data.training_duration(run, last) == 30.0
    hist = data.history_frame(s).set_index("id")
    assert hist.at[run_id, "duration"] == "30 s" and hist.at[run_id, "started"] == "1970-01-01 00:16"
    table = data.compare_frame(s, [run_id], r=1.8)
    assert table.iloc[0]["training time (s)"] == 30.0
    old = {"started_at": 10.0, "finished_at": 25.0}  # no training clock logged: the wall span
    assert data.training_duration(old, {}) == 15.0 and data.training_duration({}, {}) is None


def test_progress_line_has_seconds_per_step_and_eta_for_a_running_run(store):
    s, _, root = store
    run_id = _timed_run(s, root, "going", "jagg", 1.0, status="running")  # step 3 of 4 at 30 s
    s.log_step(run_id, 3, {"time/train_elapsed": 17.4})  # 5.8 s a step
    run = s.get_run(run_id)
    last = s.last_values(run_id, data.TRAINING_CLOCK_KEYS)
    assert data.progress_line(run, last) == "step 3/4 · 5.8 s/step · ETA 6 s"
    assert "step 3/4 · 5.8 s/step · ETA 6 s" in data.progress_markdown(run, last)
    assert data.history_frame(s).set_index("id").at[run_id, "step"] == "3/4 · 5.8 s/step · ETA 6 s"
    s.set_status(run_id, "cancelled")  # an ended run: no ETA
    assert data.progress_line(s.get_run(run_id), last) == "step 3/4"


def test_history_search_matches_run_ids_exactly(store):
    s, ids, _ = store
    hist = data.history_frame(s)
    assert list(data.filter_history(hist, f"#{ids['jagg']}")["id"]) == [ids["jagg"]]
    assert list(data.filter_history(hist, str(ids["exact"]))["id"]) == [ids["exact"]]
    assert data.filter_history(hist, "12345").empty


def test_a_pairs_live_view_overlays_both_runs_reward_curves(store):
    from app import panels

    s, ids, root = store
    reward = next(p for p in panels.panels() if p.name == "reward")
    ctx = panels.live_context(s, s.get_run(ids["jagg"]), 1.8, root, lambda items: items)
    fig = panels.render(reward, ctx)
    runs = {t.name.split(" · ")[0] for t in fig.data}
    assert runs == {f"#{ids['jagg']} jagg", f"#{ids['exact']} exact (its pair)"}
    assert fig.layout.title.text == f"Reward — run #{ids['jagg']} and its pair #{ids['exact']}"
    exact_ctx = panels.live_context(s, s.get_run(ids["exact"]), 1.8, root, lambda items: items)
    assert f"#{ids['jagg']} jagg (its pair)" in {
        t.name.split(" · ")[0] for t in panels.render(reward, exact_ctx).data
    }
    alone = _timed_run(s, root, "alone", "jagg", 1.0)
    alone_fig = panels.render(
        reward, panels.live_context(s, s.get_run(alone), 1.8, root, lambda items: items)
    )
    assert alone_fig.layout.title.text == f"Reward — run #{alone}"

"""`jagg race`: the time-to-reach arithmetic on hand-made curves, variant specs, and real races through the
command (a tiny one to the end, one stopped with Ctrl-C)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from polling import spawn, tail
from toy import RACE_TINY

from jagg_engine import race
from jagg_engine.cli import main
from jagg_engine.race import Curve, mean_curve, parse_variant, split_overrides, summarise, time_to_reach
from jagg_engine.race import plan as race_plan
from jagg_engine.store import open_store, pid_alive

TINY = RACE_TINY  # one prompt group of two samples, four sampling steps, two trained (tests/toy.py)


def jagg_race(*args: str, **kwargs) -> subprocess.Popen | subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "jagg_engine.cli", "race", *args]
    if kwargs.pop("wait", True):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=kwargs.pop("timeout", 900))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ------------------------------------------------------------------------------------------------ arithmetic


def test_time_to_reach_is_the_first_crossing_interpolated_between_evals():
    times = [0.0, 10.0, 20.0, 30.0]
    # between the last eval below (10 s, 1.1) and the first at or above (20 s, 1.3): 10 + 0.1 / 0.2 · 10
    assert time_to_reach(times, [1.0, 1.1, 1.3, 1.2], 1.2) == pytest.approx(15.0)
    # the FIRST crossing: a dip below the level afterwards does not move it (10 · 0.2 / 0.25)
    assert time_to_reach(times, [1.0, 1.25, 1.1, 1.3], 1.2) == pytest.approx(8.0)
    assert time_to_reach(times, [1.0, 1.1, 1.2, 1.3], 1.2) == pytest.approx(20.0)  # a point on the level
    assert time_to_reach(times, [1.3, 1.0, 1.0, 1.0], 1.2) == 0.0  # at or above from the start
    assert time_to_reach(times, [1.0, 1.1, 1.15, 1.19], 1.2) is None  # never reached
    assert time_to_reach([], [], 1.0) is None


def test_seed_means_level_ratio_and_spread_on_hand_made_curves():
    curves = {
        "exact": {
            0: Curve((0, 5, 10), (0.0, 10.0, 20.0), (1.0, 1.1, 1.2)),
            1: Curve((0, 5, 10), (0.0, 12.0, 24.0), (1.0, 1.05, 1.3)),
        },
        "fast": {
            0: Curve((0, 5, 10), (0.0, 5.0, 10.0), (1.0, 1.2, 1.35)),
            1: Curve((0, 5, 10), (0.0, 6.0, 12.0), (1.0, 1.1, 1.35)),
        },
    }
    s = summarise(curves, "exact")
    # the baseline's seed mean: times (0, 11, 22), rewards (1.0, 1.075, 1.25): level 1.25 at 22 s
    assert s["level"] == pytest.approx(1.25) and s["baseline_time_s"] == pytest.approx(22.0)
    assert s["level_step"] == 10
    exact, fast = s["variants"]
    assert exact["baseline"] and exact["curve"]["time_s"] == pytest.approx([0.0, 11.0, 22.0])
    assert exact["time_to_level_s"] == pytest.approx(22.0) and exact[
        "ratio_to_baseline_time"
    ] == pytest.approx(1)
    # per seed against the same level: seed 0 tops out at 1.2; seed 1 crosses at 12 + 0.2 / 0.25 · 12
    per = exact["time_to_level_per_seed_s"]
    assert per["per_seed"]["0"] is None and per["per_seed"]["1"] == pytest.approx(21.6)
    assert (per["reached"], per["seeds"]) == (1, 2)
    # fast: seed mean (0, 5.5, 11) × (1.0, 1.15, 1.35) crosses 1.25 at 5.5 + 0.1 / 0.2 · 5.5
    assert fast["time_to_level_s"] == pytest.approx(8.25)
    assert fast["ratio_to_baseline_time"] == pytest.approx(8.25 / 22)
    per = fast["time_to_level_per_seed_s"]
    assert per["per_seed"]["0"] == pytest.approx(5 + 0.05 / 0.15 * 5)
    assert per["per_seed"]["1"] == pytest.approx(6 + 0.15 / 0.25 * 6)
    assert per["min"] == pytest.approx(5 + 0.05 / 0.15 * 5) and per["max"] == pytest.approx(9.6)
    assert fast["ratio_to_same_seed_baseline"]["1"] == pytest.approx(9.6 / 24)
    assert fast["final_eval"]["mean"] == pytest.approx(1.35) and fast[
        "final_eval_seed_mean"
    ] == pytest.approx(1.35)
    assert fast["training_time_s"]["mean"] == pytest.approx(11.0)

    table = race.markdown_table(s)
    assert "| exact (baseline) | 22.0 s | 1.00× |" in table and "| fast | 8.25 s | 0.38× |" in table
    assert "(1/2)" in table and "(2/2)" in table
    svg = ET.fromstring(race.race_svg(s))
    assert len(svg.findall(".//{*}polyline[@class='mean']")) == 2
    assert len(svg.findall(".//{*}polyline[@class='seed']")) == 4
    assert [g.get("data-time") for g in svg.findall(".//{*}g[@class='reach']")] == ["22", "8.25"]


def test_seed_mean_uses_the_eval_steps_every_seed_has():
    a = Curve((0, 2, 4), (0.0, 2.0, 4.0), (1.0, 2.0, 3.0))
    b = Curve((0, 4), (0.0, 6.0), (3.0, 5.0))
    assert mean_curve([a, b]) == Curve((0, 4), (0.0, 5.0), (2.0, 4.0))


# ------------------------------------------------------------------------------------------------ specs


def test_variant_specs_split_at_top_level_commas_only():
    spec = "fast:strategy=jagg,eval_seeds=[0, 1],rewards={shapes-dense: 1.0, brightness: 0.5},name\\,x=1"
    v = parse_variant(spec)
    assert v.name == "fast"
    assert v.overrides == (
        "strategy=jagg",
        "eval_seeds=[0, 1]",
        "rewards={shapes-dense: 1.0, brightness: 0.5}",
        "name,x=1",
    )
    assert parse_variant("base:").overrides == ()
    assert split_overrides("a=[[1,2],[3]],b=2") == ["a=[[1,2],[3]]", "b=2"]


@pytest.mark.parametrize(
    "variants, words",
    [
        (["exact:strategy=exact"], ["at least two"]),
        (["exact:strategy=exact", "fast"], ["'fast'", "NAME:key=value"]),
        (["exact:strategy=exact", "a b:window=2"], ["'a b'", "name"]),
        (["exact:strategy=exact", "fast:window=1"], ["variant 'fast'", "window", ">= 2"]),
        (["exact:strategy=exact", "fast:windw=4"], ["variant 'fast'", "windw", "window"]),
        (["exact:strategy=exact", "fast:window"], ["variant 'fast'", "'window'", "key=value"]),
        (["exact:strategy=exact", "fast:eval_seeds=[0,1"], ["variant 'fast'", "unclosed bracket"]),
        (["exact:strategy=exact", "fast:seed=3"], ["variant 'fast'", "seed", "--seeds"]),
        (["exact:strategy=exact", "fast:eval_every=0"], ["variant 'fast'", "eval_every", ">= 1"]),
        (
            ["exact:strategy=exact", "fast:eval_num_prompts=3"],
            ["variant 'fast'", "eval_num_prompts", "baseline"],
        ),
        (["exact:strategy=exact", "fast:eval_every=3"], ["variant 'fast'", "eval_every", "baseline"]),
        (["exact:strategy=exact", "fast:cfg_scale=2.0"], ["variant 'fast'", "cfg_scale", "baseline"]),
        (["exact:strategy=exact", "fast:shift=2.0"], ["variant 'fast'", "shift", "baseline"]),
        (["exact:strategy=exact", "exact:strategy=jagg"], ["variant 'exact'", "twice"]),
        (["exact:window=1", "fast:strategy=jagg"], ["variant 'exact'", "window"]),  # the baseline too
    ],
)
def test_bad_variants_are_refused_in_one_line_before_anything_starts(tmp_path, capsys, variants, words):
    out = tmp_path / "race"
    argv = ["race", "configs/tiny-shapes-cpu.yaml", "--seeds", "0,1", "--out", str(out), *TINY]
    for spec in variants:
        argv += ["--variant", spec]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("jagg race: error: "), err
    for word in words:
        assert word in err, (word, err)
    assert not out.exists()  # no folder, no store, no run


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own refusals (the parser prints one line, then exits)
        return int(exc.code)


def test_a_bad_trailing_override_seed_list_or_flag_is_one_line_too(tmp_path, capsys):
    out = tmp_path / "race"
    base = ["race", "--variant", "a:strategy=exact", "--variant", "b:strategy=jagg", "--out", str(out)]
    cases = [
        (["steps=0"], "variant 'a': steps"),
        (["seed=4"], "seed: set by the race (--seeds)"),
        (["--seeds", "0,0"], "seeds: must not repeat"),
        (["--threads", "0"], "--threads"),
        (["configs/tiny-shapes-cpu.yaml", "--threads", "0"], "--threads"),  # a flag after the CONFIG
        (["configs/tiny-shapes-cpu.yaml", "--bogus"], "unrecognized option '--bogus'"),
        (["--baseline", "b"], "--baseline: only with --report-only"),
        (["--report-only"], "holds no race"),
    ]
    for extra, words in cases:
        assert exit_code([*base, *extra]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, (extra, err)
    assert not out.exists()


def test_the_schedule_is_the_apps_pair_rule_for_one_run_per_variant(monkeypatch):
    from jagg_engine.train.config import TrainConfig

    configs = {("a", 0): TrainConfig(), ("b", 0): TrainConfig(), ("c", 0): TrainConfig()}
    monkeypatch.setattr(race_plan, "gpu_present", lambda: False)
    monkeypatch.setattr(race_plan, "usable_cores", lambda: 6)
    plan = race.schedule(configs, 3, None)
    assert (plan.mode, plan.threads) == ("side-by-side", 2)  # 6 cores over 3 runs
    monkeypatch.setattr(race_plan, "usable_cores", lambda: 2)
    plan = race.schedule(configs, 3, None)
    assert plan.mode == "sequential" and "too few for 3 runs" in plan.reason
    plan = race.schedule(configs, 3, 1)
    assert (plan.mode, plan.threads) == ("side-by-side", 1)  # --threads 1: side by side anyway
    monkeypatch.setattr(race_plan, "gpu_present", lambda: True)
    assert race.schedule(configs, 3, None).mode == "sequential"


# ------------------------------------------------------------------------------------------------ real races


@pytest.mark.slow
def test_a_tiny_race_through_the_command_writes_json_plot_and_table(tmp_path):
    out = tmp_path / "race"
    proc = jagg_race(
        "configs/tiny-shapes-cpu.yaml",
        "--variant", "exact:strategy=exact",
        "--variant", "jagg:strategy=jagg,eval_seeds=[0]",  # a list value inside a spec
        "--seeds", "0,1",
        "--out", str(out),
        "--threads", "1",
        "steps=2",
        *TINY,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "race.json").read_text())
    assert result["status"] == "finished" and result["schedule"]["mode"] == "side-by-side"
    assert [(r["variant"], r["seed"]) for r in result["runs"]] == [
        ("exact", 0), ("jagg", 0), ("exact", 1), ("jagg", 1)
    ]  # fmt: skip
    assert all(r["status"] == "finished" and r["threads_logged"] == 1 for r in result["runs"])
    # One heat per seed: its two runs start together (one poll), the next heat after they have ended.
    store = open_store(out / "runs")
    rows = [store.get_run(r["run_id"]) for r in result["runs"]]
    assert (
        abs(rows[0]["created_at"] - rows[1]["created_at"]) < 5
        and abs(rows[2]["created_at"] - rows[3]["created_at"]) < 5
    )
    assert min(rows[2]["created_at"], rows[3]["created_at"]) >= max(
        rows[0]["finished_at"], rows[1]["finished_at"]
    )
    assert [h["seed"] for h in result["heats"]] == [0, 1]
    assert all(0 <= h["all_training_together_s"] <= h["first_start_to_last_end_s"] for h in result["heats"])

    # Every figure comes back from the store: the level is exact's final eval, meaned over its two seeds.
    frames = {(r["variant"], r["seed"]): store.metrics_frame(r["run_id"]) for r in result["runs"]}
    s = result["summary"]
    finals = [frames[("exact", seed)].set_index("step")["eval/reward/mean"][2] for seed in (0, 1)]
    assert s["level"] == pytest.approx(sum(finals) / 2) and s["level_step"] == 2
    for v in s["variants"]:
        for seed in (0, 1):
            f = frames[(v["variant"], seed)].set_index("step")
            c = v["curves_per_seed"][str(seed)]
            assert c["step"] == [0, 1, 2] and c["eval"] == pytest.approx(f["eval/reward/mean"].tolist())
            assert c["time_s"] == pytest.approx([0.0, *f["time/train_elapsed"].iloc[1:].tolist()])
        mean = v["curve"]
        assert v["time_to_level_s"] == time_to_reach(mean["time_s"], mean["eval"], s["level"])
        ratio = v["ratio_to_baseline_time"]
        assert ratio is None or ratio == pytest.approx(v["time_to_level_s"] / s["baseline_time_s"])
    assert s["variants"][0]["time_to_level_s"] is not None  # the baseline reaches its own final eval

    svg = ET.fromstring((out / "race.svg").read_text())
    assert [p.get("data-variant") for p in svg.findall(".//{*}polyline[@class='mean']")] == ["exact", "jagg"]
    assert len(svg.findall(".//{*}polyline[@class='seed']")) == 4
    table = (out / "race.md").read_text()
    assert "| exact (baseline) |" in table and "| jagg |" in table and "jagg race" in table
    assert "| exact (baseline) |" in proc.stdout  # the table is printed

    # --report-only rebuilds the same figures from the store.
    (out / "race.svg").unlink()
    again = jagg_race("--report-only", "--out", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "race.json").read_text())["summary"] == s and (out / "race.svg").is_file()
    # ... and measures against another variant, beside the race's own files.
    vs = jagg_race("--report-only", "--out", str(out), "--baseline", "jagg")
    assert vs.returncode == 0, vs.stderr[-3000:]
    other = json.loads((out / "race-vs-jagg.json").read_text())["summary"]
    jagg = next(v for v in s["variants"] if v["variant"] == "jagg")
    assert other["baseline"] == "jagg" and other["level"] == pytest.approx(jagg["final_eval_seed_mean"])
    assert (out / "race-vs-jagg.svg").is_file() and "| jagg (baseline) |" in (
        out / "race-vs-jagg.md"
    ).read_text()
    assert json.loads((out / "race.json").read_text())["summary"] == s
    bad = jagg_race("--report-only", "--out", str(out), "--baseline", "nope")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "jagg race: error: --baseline: 'nope' is not a variant of this race; one of exact, jagg"
    ]


@pytest.mark.slow
def test_ctrl_c_stops_every_run_of_the_race(tmp_path):
    """Ctrl-C of the driver cancels both runs of its heat, each with a checkpoint, and the race reads
    interrupted. The runs are far longer than the wait for their first step (5000 steps: a loaded machine once
    let 500 finish first), and the driver's output goes to a file that nobody has to drain."""
    out, log = tmp_path / "race", tmp_path / "race.log"
    cmd = [sys.executable, "-m", "jagg_engine.cli", "race", "--variant", "exact:strategy=exact", "--variant",
           "jagg:strategy=jagg", "--seeds", "0", "--out", str(out), "--threads", "1", "steps=5000", *TINY]  # fmt: skip
    proc = spawn(cmd, log)

    def both_trained() -> bool:
        if not (out / "runs" / "jagg.db").is_file() or not (out / "race.json").is_file():
            return False
        runs = json.loads((out / "race.json").read_text())["runs"]
        store = open_store(out / "runs")
        return len(runs) == 2 and all((store.get_run(r["run_id"])["last_step"] or 0) >= 1 for r in runs)

    deadline = time.time() + 600
    while not both_trained():
        assert proc.poll() is None and time.time() < deadline, tail(log)
        time.sleep(0.5)
    store = open_store(out / "runs")
    runs = [store.get_run(r["run_id"]) for r in json.loads((out / "race.json").read_text())["runs"]]
    pids = [(run["pid"], run["pid_at"]) for run in runs]
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=600)
    err = log.read_text()
    assert proc.returncode == 130, err[-3000:]
    assert "stopping 2 run(s)" in err and "interrupted" in err
    for run in runs:
        run = store.get_run(run["id"])
        assert run["status"] == "cancelled" and run["last_step"] < 5000
        assert list((Path(run["run_dir"]) / "checkpoints").glob("step_*/manifest.json"))  # stopped cleanly
    assert not any(pid_alive(pid, at) for pid, at in pids)
    assert json.loads((out / "race.json").read_text())["status"] == "interrupted"
    assert os.path.isfile(out / "race.json")


def test_a_baseline_that_did_not_improve_is_said_so():
    flat = {
        "exact": {0: Curve((0, 2), (0.0, 9.0), (1.0, 0.9))},
        "jagg": {0: Curve((0, 2), (0.0, 7.0), (1.0, 0.8))},
    }
    s = summarise(flat, "exact")
    assert s["baseline_start"] == 1.0 and not s["baseline_improved"]
    assert [v["time_to_level_s"] for v in s["variants"]] == [0.0, 0.0]  # both start above the level
    assert "did not improve" in race.markdown_table(s)
    assert summarise({"exact": {0: Curve((0, 2), (0.0, 9.0), (1.0, 1.1))}}, "exact")["baseline_improved"]


CRASHING_SDE = """
from jagg_engine.sde import register_sde


def crash(sampler, v, z, j, sigmas, prev_sample=None, noise=None, generator=None):
    raise RuntimeError("boom")


register_sde("crash-sde", crash)
"""


@pytest.mark.slow
def test_a_run_that_fails_stops_the_race_in_one_line(tmp_path):
    (tmp_path / "crashing_sde.py").write_text(CRASHING_SDE)  # an SDE kind that raises at the first rollout
    out = tmp_path / "race"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "jagg_engine.cli",
        "race",
        "--seeds",
        "0",
        "--out",
        str(out),
        "--threads",
        "1",
    ]
    cmd += [
        "--variant",
        "exact:strategy=exact",
        "--variant",
        "crash:plugins=[crashing_sde],algorithm=crash-sde",
    ]
    proc = subprocess.run([*cmd, "steps=500", *TINY], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "jagg race: error: variant 'crash' seed 0 (run 2) ended failed: RuntimeError: boom"
    )
    assert last.endswith("run-0002/train.log)")
    store = open_store(out / "runs")
    exact = store.get_run(1)
    assert exact["status"] == "cancelled" and (exact["last_step"] or 0) < 500  # stopped, not left training
    pids = [int(pid) for pid in re.findall(r"\(pid (\d+)\)", proc.stderr)]  # the heat's line: both trainers
    assert len(pids) == 2 and not any(pid_alive(pid) for pid in pids)
    assert json.loads((out / "race.json").read_text())["status"] == "failed"


def test_the_paired_table_counts_seeds_below_and_averages_the_batch_spread():
    import pandas as pd

    from jagg_engine.race.summary import batch_spread, markdown_table

    frame = pd.DataFrame({"step": range(1, 31), "reward/std": [0.4] * 10 + [0.45] * 10 + [0.5] * 10})
    assert batch_spread(frame) == pytest.approx((0.4, 0.5))
    assert batch_spread(pd.DataFrame({"step": [1]})) is None

    def curve(final: float) -> Curve:
        return Curve((0, 10), (0.0, 100.0), (1.0, final))

    curves = {
        "exact": {0: curve(1.10), 1: curve(1.20), 2: curve(1.30)},
        "jagg": {0: curve(1.05), 1: curve(1.21)},
    }
    spreads = {"exact": {0: (0.4, 0.38), 1: (0.4, 0.36)}, "jagg": {0: (0.4, 0.5), 1: (0.42, 0.46)}}
    s = summarise(curves, "exact", spreads)
    p = s["variants"][1]["paired"]
    assert p["seeds_paired"] == 2 and p["seeds_below"] == 1  # seed 2 has no jagg run: not paired
    assert p["final_gap_mean"] == pytest.approx((-0.05 + 0.01) / 2)
    assert p["final_gap_se"] == pytest.approx(0.06 / 2**0.5 / 2**0.5)  # stdev of (−0.05, 0.01) over √2
    assert (p["spread_first"], p["spread_last"]) == pytest.approx((0.41, 0.48))
    assert "| jagg | -0.0200 ± 0.0300 | 1/2 | 0.410 → 0.480 |" in markdown_table(s)
    assert "paired" not in summarise(curves, "exact")["variants"][1]


def test_the_best_eval_table_tells_a_variant_that_peaked_sooner_from_one_that_peaked_lower():
    """A variant that reaches the baseline's best sooner and then declines, as the baseline does later, ends
    below it but has its best level with it; one whose best is lower is below in both tables."""
    from jagg_engine.race.summary import best_eval, markdown_table

    steps, times = (0, 10, 20, 30), (0.0, 10.0, 20.0, 30.0)
    assert best_eval(Curve(steps, times, (0.1, 0.9, 0.9, 0.5))) == (0.9, 10)  # the first step with the best

    def curves(*runs: tuple[float, ...]) -> dict[int, Curve]:
        return {seed: Curve(steps, times, values) for seed, values in enumerate(runs)}

    race = {
        "exact": curves((0.1, 0.5, 0.9, 0.8), (0.1, 0.6, 0.8, 0.8)),
        "sooner": curves((0.1, 0.9, 0.7, 0.6), (0.1, 0.8, 0.7, 0.6)),  # the same bests, at step 10
        "lower": curves((0.1, 0.6, 0.7, 0.7), (0.1, 0.6, 0.7, 0.75)),
    }
    spreads = {name: {0: (0.4, 0.4), 1: (0.4, 0.4)} for name in race}
    s = summarise(race, "exact", spreads)
    sooner, lower = (v["paired"] for v in s["variants"][1:])
    assert sooner["final_gap_mean"] == pytest.approx(-0.2) and sooner["seeds_below"] == 2
    assert sooner["best_gap_mean"] == pytest.approx(0.0) and sooner["best_seeds_below"] == 0
    assert sooner["best_step_median"] == 10 and s["variants"][0]["paired"]["best_step_median"] == 20
    assert lower["best_gap_mean"] == pytest.approx(-0.125) and lower["best_seeds_below"] == 2
    table = markdown_table(s)
    assert "| sooner | +0.0000 ± 0.0000 | 0/2 | 10 |" in table
    assert "| lower | -0.1250 ± 0.0750 | 2/2 | 25 |" in table
    assert "| exact | +0.0000 | — | 20 |" in table

"""Every command in a ```bash block of README.md and the docs pages is accounted for here, and each is run or
checked by a test (a synopsis, with placeholders, is only listed): the README's tour and the quick ones of the Training page run as written here, in a fresh
folder; some run as written in the test named for them; those that train or measure for minutes to hours (the
races and studies behind reports/) have their arguments parsed by the command's own parser and their configs
validated by `jagg train`'s and `jagg race`'s checks, without training; GPU-only ones are named as such. A new
command in the docs fails this file until it is given one of those."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docs_pages import ROOT, pages

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TOUR = "README.md"
# (page, command) → how the suite covers it: ("run", session) runs it here as written, in the session's own
# folder, in page order; ("test", "file::name") that test runs it as written; ("checked", why) its arguments
# and config are checked here, it is not run; ("gpu", why) it needs a CUDA GPU; ("suite", why) it is the suite;
# ("synopsis", why) the form of a command, with placeholders.
RUN_HERE = "run"
COMMANDS: dict[tuple[str, str], tuple[str, str]] = {}


def cover(page: str, kind: str, detail: str, *commands: str) -> None:
    for command in commands:
        COMMANDS[(page, command)] = (kind, detail)


LONG_RACE = "a race of tens of training steps per variant (minutes to hours): its output is in reports/race/"
cover("README.md", "suite", "it runs this suite", "make test")
cover("docs/index.md", "suite", "it runs this suite", "make test")
cover(
    "README.md",
    "test",
    "tests/test_app_e2e.py::test_launch_restart_finish_and_cancel_through_the_api",
    "make demo",
)
cover(
    "docs/index.md",
    "test",
    "tests/test_app_e2e.py::test_launch_restart_finish_and_cancel_through_the_api",
    "make demo",
)
cover(
    TOUR,
    RUN_HERE,
    "tour",
    "jagg train steps=2 prompts_per_step=2 eval_every=1 eval_num_prompts=4",
    "jagg runs",
    "jagg race --variant exact:strategy=exact --variant jagg:strategy=jagg --seeds 0 --out race-demo"
    " steps=2 prompts_per_step=2 eval_every=1 eval_num_prompts=4",
    "jagg export-model 1 --out exports/run-1",
    "jagg eval --model exports/run-1 --json",
)
cover(
    "docs/training.md",
    RUN_HERE,
    "training",  # beside a runs/ folder holding a finished run 1 (the tour's)
    "jagg probe --backbone tiny-flux --window 4 --steps 12",
    "jagg probe --backbone linear-toy --window 4 --steps 12 --json",
    "jagg runs",
    "jagg export 1",
    "jagg reindex --runs-dir runs",
    "jagg export-model 1 --out exports/run-1",
    "jagg eval --run 1 --json",
    'jagg sample 1 --with-base --prompt "red circle left" --seeds 0,1 --out try-it.png',
)
cover(
    "docs/training.md",
    "checked",
    "trains or measures for minutes (the shipped batch, its full eval)",
    "jagg train configs/tiny-shapes-cpu.yaml steps=20 window=4 jagg_frac=0.6",
    "jagg train --resume 1",
    "jagg train --resume 1 --from-scratch",
    "jagg eval --backbone tiny-shapes --reward shapes",
    "jagg bench --backbone bench-flux --window 4 --jagg-frac 1 --threads 1 --clock cpu",
    "jagg study cosine --backbone tiny-shapes --reward shapes-dense --batch 64 --batches 3 --out reports/cosine",
    "jagg study cosine --run 1 --step 40 --batch 64 --batches 3",
    "jagg study parity configs/tiny-shapes-cpu.yaml --strategies exact,jagg,endpoint --seeds 0,1,2",
    "jagg race configs/tiny-shapes-cpu.yaml --variant exact:strategy=exact --variant jagg:strategy=jagg"
    " --seeds 0,1,2 --out reports/race/x",
)
cover("docs/training.md", "test", "tests/test_app_e2e.py::test_launch_restart_finish_and_cancel_through_the_api",
      "python launch.py --port 7860")  # fmt: skip
cover("docs/extending.md", "test", "tests/test_registries.py::test_readme_plugin_registers_in_every_process_of_jagg_train",
      'PYTHONPATH=. jagg train plugins=[my_plugin] backbone=toy algorithm=euler-maruyama "rewards={redness: 1.0}"')  # fmt: skip
cover("docs/report.md", "test", "tests/test_report.py::test_readme_command_runs_as_written",
      "jagg report 1 2 --out report.html")  # fmt: skip
SCALE = "jagg train steps=2 prompts_per_step=2 group_size=4 sampling_steps=6 sde_window_end=4 eval_every=0 --processes 2"
cover("docs/scale.md", "test", "tests/test_multinode.py::test_readme_two_machines_on_loopback_match_one_machine",
      SCALE, *(f"{SCALE} --machines 2 --machine-rank {r} --main-address 10.0.0.1:29500" for r in (0, 1)))  # fmt: skip
cover("docs/scale.md", "gpu", "one CUDA GPU; tests/test_gpu_check.py runs it narrowed on the CPU",
      "python scripts/gpu_check.py")  # fmt: skip
cover(
    "docs/scale.md",
    "checked",
    "measures for minutes: its output is in reports/bench/",
    "jagg bench --backbone bench-flux --window 4 --micro-batch 2 --batch 8 --memory-only --threads 1 --json",
    "jagg bench --backbone bench-flux --window 4 --jagg-frac 1 --micro-batch 1 --repeats 7 --threads 1 --clock cpu --json",
    "jagg bench --backbone bench-flux --window 8 --jagg-frac 1 --micro-batch 1 --repeats 7 --threads 1 --clock cpu --json",
)
cover("docs/faults.md", "checked", "builds a history of 1.6 M metric rows and times it (a benchmark)",
      "python scripts/bench_tick.py")  # fmt: skip
cover("docs/windowed.md", "checked", "36 prompts sampled five ways; tests/test_window.py runs it on 2 prompts",
      "python scripts/ode_solver_check.py configs/tiny-shapes-cpu.yaml --windows 0-4,4-8 --prompts 36")  # fmt: skip
cover("docs/app.md", "checked", "packs the runs of a race run on the machine that ran it (runs/ is not committed);"
      " tests/test_showcase.py runs the script on runs it trains", "python scripts/record_showcase.py --pack-only"
      " reports/race/early-window-shipped/runs --runs exact=1,jagg=3 --max-step 40 --image-every 20")  # fmt: skip
cover(
    "docs/using.md",
    "checked",
    "4 steps of the shipped batch and its full eval (minutes); tests/test_eval_run.py and tests/test_export.py"
    " make the same calls on one-step runs",
    "jagg train configs/tiny-shapes-cpu.yaml steps=4 eval_every=2 --runs-dir runs-aligned",
    "jagg export-model 1 --out exports/run-1 --runs-dir runs-aligned",
    "jagg eval --run 1 --step 4 --runs-dir runs-aligned",
    "jagg eval --model exports/run-1 --json",
    'jagg sample 1 --with-base --prompt "red circle left" "blue square top" --seeds 0,1 --out try-it.png'
    " --runs-dir runs-aligned",
    "jagg train configs/tiny-shapes-cpu.yaml model_path=exports/run-1 --runs-dir runs-aligned",
)
cover("docs/picks.md", "checked", "waits for a person's votes (a run of minutes to hours); tests/test_picks_run.py runs"
      " a picks run with a scripted person", 'jagg train configs/tiny-shapes-cpu.yaml "rewards={picks: 1.0}"'
      ' "reward_options={picks: {picks_per_step: 4, timeout_s: 300}}"')  # fmt: skip
cover("docs/picks.md", "checked", "trains several runs (tens of minutes): its output is in reports/picks/",
      "python scripts/bench_picks.py --out reports/picks",
      "python scripts/bench_picks.py --budgets 100 300 --steps 75 --prompts-per-step 8 --group-size 8"
      " --picks-per-step 4 --eval-prompts 40 --taste small --seed 0 --skip-votes-alone --out reports/picks/small-seed0")  # fmt: skip
cover("docs/race.md", "synopsis", "the command's form (CONFIG, NAME and DIR stand for values)",
      "jagg race CONFIG --variant NAME:key=value,... [--variant ...] --seeds 0,1,2 --out DIR [key=value ...]",
      "jagg race --report-only --out DIR [--baseline NAME]")  # fmt: skip


def _results_commands() -> None:
    """docs/results.md: each race's command (checked: a long race) and its --report-only ones (checked: their
    outputs are committed beside the race); the studies' and benchmarks' commands (checked: minutes to hours)."""
    for command in extract_commands("docs/results.md"):
        if command.startswith("jagg race --report-only"):
            cover(
                "docs/results.md", "checked", "the race's runs were not committed: its outputs are", command
            )
        elif command.startswith("jagg race "):
            cover("docs/results.md", "checked", LONG_RACE, command)
        else:
            cover(
                "docs/results.md",
                "checked",
                "a study or benchmark of minutes to hours: reports/ holds it",
                command,
            )


def extract_commands(page: str) -> list[str]:
    """The commands of a page's ```bash blocks: continuation lines joined, comments and blank lines dropped."""
    text = (ROOT / page).read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                out.append(" ".join(command.split()))
    return out


_results_commands()


def documented() -> list[tuple[str, str]]:
    return [
        (page.relative_to(ROOT).as_posix(), command)
        for page in pages()
        for command in extract_commands(page.relative_to(ROOT).as_posix())
    ]


def argv_of(command: str) -> list[str]:
    """The command as this checkout runs it: `jagg` is `python -m jagg_engine.cli`, `python` this one."""
    words = shlex.split(command)
    words = [w for w in words if not re.match(r"^[A-Z_]+=", w)]  # PYTHONPATH=. (ENV has the checkout)
    if words[0] == "jagg":
        return [sys.executable, "-m", "jagg_engine.cli", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return words


def test_every_documented_command_is_run_or_checked_by_a_test():
    found = documented()
    missing = [f"{page}: {command}" for page, command in found if (page, command) not in COMMANDS]
    assert missing == [], "give each a line in COMMANDS:\n" + "\n".join(missing)
    stale = [f"{page}: {command}" for page, command in COMMANDS if (page, command) not in found]
    assert stale == [], "no longer in the docs:\n" + "\n".join(stale)


def test_the_tests_named_for_commands_exist():
    for kind, detail in set(COMMANDS.values()):
        if kind == "test":
            path, name = detail.split("::")
            assert re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), detail


def run_session(name: str, folder: Path) -> list[subprocess.CompletedProcess]:
    done = []
    for page, command in documented():
        if COMMANDS[(page, command)] != (RUN_HERE, name):
            continue
        proc = subprocess.run(
            argv_of(command), cwd=folder, env=ENV, capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, f"{page}: {command}\n{proc.stderr[-3000:]}"
        done.append(proc)
    return done


@pytest.fixture(scope="module")
def tour(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tour")
    outputs = run_session("tour", folder)
    evaluated = json.loads(outputs[-1].stdout)
    sys.path.insert(0, str(ROOT))
    from jagg_engine.store import open_store

    with open_store(folder / "runs") as store:
        frame = store.metrics_frame(1)
    last = frame["eval/reward/mean"].dropna().iloc[-1]
    assert evaluated["reward_mean"] == pytest.approx(
        last, abs=1e-4
    )  # "the export's eval: run 1's own last eval"
    return folder


def test_the_readme_tour_runs_as_written(tour):
    race = json.loads((tour / "race-demo" / "race.json").read_text())
    assert race["status"] == "finished" and [v["variant"] for v in race["summary"]["variants"]] == [
        "exact",
        "jagg",
    ]
    assert (tour / "exports" / "run-1" / "README.md").is_file()


def test_the_training_pages_quick_commands_run_as_written(tour, tmp_path):
    shutil.copytree(tour / "runs", tmp_path / "runs")
    run_session("training", tmp_path)
    assert (tmp_path / "try-it.png").is_file() and (
        tmp_path / "exports" / "run-1" / "jagg_run.json"
    ).is_file()


def check(command: str) -> None:
    """Parse ``command`` with its own parser and validate what it would train, without running it."""
    words = shlex.split(command)
    if words[0] == "jagg":
        from jagg_engine import cli

        args = cli.build_parser().parse_args(words[1:])
        if args.command == "train" and args.resume is None:
            from jagg_engine.train.config import load_config

            load_config(args.config, args.overrides, check_environment=False)
        elif args.command == "race" and not args.report_only:
            from jagg_engine.race import check_variants, parse_seeds, parse_variant
            from jagg_engine.race.command import _parse_rest

            _parse_rest(args)
            variants = [parse_variant(text) for text in args.variant]
            check_variants(args.config, args.overrides, variants, parse_seeds(args.seeds))
        elif args.command == "race":
            folder = ROOT / args.out
            assert (folder / "race.json").is_file(), command
            if args.baseline:
                assert (folder / f"race-vs-{args.baseline}.json").is_file(), command
    else:
        script = ROOT / words[1]
        usage = subprocess.run(
            [sys.executable, str(script), "--help"],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert usage.returncode == 0, usage.stderr[-2000:]
        for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
            assert flag in usage.stdout, (command, flag)


@pytest.mark.parametrize(
    "page,command",
    sorted(k for k, (kind, _) in COMMANDS.items() if kind == "checked"),
    ids=lambda v: v if len(v) < 60 else v[:57] + "...",
)
def test_a_long_command_parses_and_its_config_validates(page, command, monkeypatch):
    monkeypatch.chdir(ROOT)
    check(command)

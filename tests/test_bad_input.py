"""Bad input, everywhere: each class of bad value given to `jagg train` and to the app's form and handlers is
refused before anything is written — exit code 2 (CLI) or one inline line (app) naming the field, no
traceback, and the same runs rows and run folders before and after.

The CLI runs in-process (``cli.main``) with the trainer replaced by a function that fails the test if it is
ever reached; one case also runs the real ``python -m jagg_engine.cli`` in a subprocess.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import jagg_engine.train.process as trainer
from jagg_engine import cli
from jagg_engine.store import open_store
from jagg_engine.train.config import INT_MAX, ConfigError, TrainConfig

ASSETS = Path(__file__).parents[1] / "assets" / "tiny-shapes"
BIG = 2**70  # past 64 bits


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Bad files and folders the cases point at."""
    made = {
        "empty.yaml": "",
        "comments.yaml": "# nothing but a comment\n",
        "list.yaml": "- 1\n- 2\n",
        "scalar.yaml": "5\n",
    }
    for name, text in made.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (tmp_path / "latin1.txt").write_bytes("a red caf\xe9\n".encode("latin-1"))
    (tmp_path / "prompts.txt").write_text("a cat\na dog\n", encoding="utf-8")
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty-dir").mkdir()
    (tmp_path / "no-pipeline").mkdir()
    (tmp_path / "no-pipeline" / "transformer").mkdir()
    return {"tmp": tmp_path, **{p.name: p for p in tmp_path.iterdir()}}


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody can write: a read-only tmpfs when root (root ignores permissions), else mode 0555."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], check=True)
        try:
            yield folder
        finally:
            subprocess.run(["umount", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)


def _snapshot(runs: Path) -> tuple[int, list[str]]:
    """(rows in runs, entries of the runs folder) — what a refusal must leave as it was."""
    db = runs / "jagg.db"
    rows = -1
    if db.exists():
        with sqlite3.connect(db) as con:
            rows = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    names = sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []
    return rows, names


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A runs folder with a history of one run, so that "nothing written" is seen in the counts."""
    root = tmp_path / "runs"
    with open_store(root) as store:
        run_id = store.create_run("earlier", TrainConfig().to_dict(), root / "run-0001")
        (root / "run-0001").mkdir()
        store.set_status(run_id, "cancelled")
    return root


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def reached(*args: object, **kwargs: object) -> int:
        raise AssertionError("a bad value reached the trainer")

    monkeypatch.setattr(trainer, "train", reached)


# Each class of the issue with values of it: (class, override arguments, the field the one line names first).
# "<tmp>" and "<file name>" are filled in from the `files` fixture.
CLI_CASES = [
    ("int range", ["steps=0"], "steps: must be an integer >= 1, got 0"),
    ("int range", [f"steps={BIG}"], f"steps: must be an integer <= {INT_MAX}, got {BIG}"),
    ("int range", [f"seed={2**40}"], f"seed: must be an integer <= {INT_MAX}"),
    ("int range", ["seed=-1"], "seed: must be an integer >= 0, got -1"),
    ("int range", [f"eval_seeds=[0, {BIG}]"], f"eval_seeds[1]: must be an integer <= {INT_MAX}"),
    ("int range", ["sampling_steps=100000"], "sampling_steps: must be an integer <= 1000"),
    ("int range", [f"checkpoint_every={BIG}"], "checkpoint_every: must be an integer <="),
    ("int range", ["window=true"], "window: must be an int, got 'true'"),
    ("int range", ["lr=nan"], "lr: must be a finite number, got nan"),
    ("int range", ["rewards={shapes-dense: .inf}"], "rewards.shapes-dense: must be a finite number, got inf"),
    (
        "nested types",
        ["rewards={brightness: 1}", "reward_options={brightness: {scale: abc}}"],
        "reward_options.brightness.scale: must be a finite number, got 'abc'",
    ),
    (
        "nested types",
        ["backbone_options={train_embeddings: maybe}"],
        "backbone_options.train_embeddings: must be true or false, got 'maybe'",
    ),
    ("nested types", ["backbone_options={seed: 1.5}"], "backbone_options.seed: must be an integer, got 1.5"),
    ("nested types", ["reward_options={shapes-dense: 5}"], "reward_options.shapes-dense: must be a mapping"),
    ("unknown options", ["backbone_options={lora: 4}"], "backbone_options.lora: unknown option; allowed: "),
    ("unknown names", ["algorithm=ddim"], "algorithm: must be one of flow-grpo, dance, cps, got 'ddim'"),
    (
        "unknown names",
        ["plugins=[no_such_plugin_module]"],
        "plugins: cannot import 'no_such_plugin_module' (",
    ),
    (
        "unknown options",
        ["rewards={brightness: 1}", "reward_options={brightness: {bogus: 1}}"],
        "reward_options.brightness.bogus: unknown option; allowed: scale",
    ),
    (
        "unknown options",
        ["backbone_options={cfg_scale: 2.0}"],
        "backbone_options.cfg_scale: not allowed here; set the field cfg_scale",
    ),
    (
        "ignored",
        ["lora_rank=4"],
        "lora_rank: backbone 'tiny-shapes' does not use it (only flux, qwen-image, sd3)",
    ),
    ("ignored", ["precision=bf16"], "precision: backbone 'tiny-shapes' does not use it"),
    ("ignored", ["gradient_checkpointing=true"], "gradient_checkpointing: backbone 'tiny-shapes' does not"),
    ("ignored", ["backbone=tiny-flux", "cfg_scale=3"], "cfg_scale: backbone 'tiny-flux' does not use it"),
    (
        "ignored",
        ["backbone=tiny-flux", "model_path=<tmp>"],
        "model_path: backbone 'tiny-flux' does not use it",
    ),
    ("ignored", ["fsdp=true"], "fsdp: shards the model across processes; needs processes > 1"),
    ("yaml", ["<empty.yaml>"], "config file: <empty.yaml> is empty; it must be a mapping"),
    ("yaml", ["<comments.yaml>"], "config file: <comments.yaml> is empty"),
    (
        "yaml",
        ["<list.yaml>"],
        "config file: <list.yaml> must be a mapping of field names to values, got list",
    ),
    (
        "yaml",
        ["<scalar.yaml>"],
        "config file: <scalar.yaml> must be a mapping of field names to values, got int",
    ),
    ("utf-8", ["<latin1.yaml>"], "config file: <latin1.yaml> is not UTF-8 text (byte 0xe9 at offset 9)"),
    ("utf-8", ["prompts_file=<latin1.txt>"], "prompts_file: <latin1.txt> is not UTF-8 text (byte 0xe9"),
    ("output folder", ["output_dir=<a-file>"], "output_dir: <a-file> is a file, not a folder"),
    (
        "output folder",
        ["output_dir=<a-file>/runs"],
        "output_dir: cannot create <a-file>/runs: <a-file> is a file",
    ),
    ("output folder", ["output_dir=/proc/jagg-no-such"], "output_dir: cannot write to /proc/jagg-no-such: "),
    ("output folder", ["output_dir=<tmp>/" + "x" * 300], "output_dir: the name 'xxxx"),
    (
        "model path",
        ["model_path=<empty-dir>"],
        "model_path: <empty-dir> holds no tiny-shapes weights (missing",
    ),
    (
        "model path",
        ["backbone=flux", "prompts_file=<prompts.txt>", "eval_num_prompts=2", "model_path=<no-pipeline>"],
        "model_path: <no-pipeline> holds no flux pipeline (missing model_index.json)",
    ),
    (
        "batch",
        ["group_size=4096", "prompts_per_step=2"],
        "group_size: group_size × prompts_per_step / processes",
    ),
    (
        "batch",
        ["eval_seeds=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]"],
        "eval_num_prompts: eval_num_prompts × len(",
    ),
]


def _fill(text: str, files: dict[str, Path]) -> str:
    for name, path in files.items():
        text = text.replace(f"<{name}>", str(path))
    return text


def rendered(markdown: str) -> str:
    """An app message as its Markdown renders it: the backslash escapes of app.text.md_message removed (a
    refused value is quoted escaped, so that it shows as typed, never as a link, image or HTML)."""
    return re.sub(r"\\(.)", r"\1", markdown)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    capsys.readouterr()
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own refusals (a flag that is not an integer)
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()


@pytest.mark.parametrize(
    ("kind", "args", "message"), CLI_CASES, ids=[f"{c[0]}:{c[1][-1][:30]}" for c in CLI_CASES]
)
def test_jagg_train_refuses_with_exit_2_and_writes_nothing(
    kind: str, args: list[str], message: str, files, runs: Path, no_training, capsys
) -> None:
    args = [_fill(a, files) for a in args]
    before = _snapshot(runs)
    runs_flag = [] if any(a.startswith("output_dir=") for a in args) else ["--runs-dir", str(runs)]
    code, lines = _cli(["train", *args, *runs_flag], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"jagg train: error: {_fill(message, files)}"), lines[0]
    assert _snapshot(runs) == before
    for arg in args:  # an output folder given in the config is not created either
        if arg.startswith("output_dir="):
            target = arg.partition("=")[2]
            assert not os.path.isdir(target) or not os.listdir(target)


def test_a_read_only_runs_folder_is_refused(read_only: Path, no_training, capsys) -> None:
    before = _snapshot(read_only)
    for target in (read_only, read_only / "runs"):
        code, lines = _cli(["train", "--runs-dir", str(target)], capsys)
        assert code == 2 and len(lines) == 1
        assert lines[0].startswith(f"jagg train: error: --runs-dir: cannot write to {target}: "), lines[0]
    assert _snapshot(read_only) == before == (-1, [])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--run-id", str(BIG)], "--run-id: must be a run id from 1 to 9223372036854775807"),
        (["--resume", "0"], "--resume: must be a run id from 1"),
        (["--resume", "99"], "run id: no run 99 in"),
        (["--processes", "0"], "--processes: must be an integer >= 1, got 0"),
        (["--run-id", "1.5"], "argument --run-id: invalid int value: '1.5'"),
    ],
)
def test_run_id_and_process_flags(argv: list[str], message: str, runs: Path, no_training, capsys) -> None:
    before = _snapshot(runs)
    code, lines = _cli(["train", *argv, "--runs-dir", str(runs)], capsys)
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert _snapshot(runs) == before


def test_resume_in_a_folder_without_history_creates_nothing(tmp_path: Path, no_training, capsys) -> None:
    code, lines = _cli(["train", "--resume", "3", "--runs-dir", str(tmp_path / "none")], capsys)
    assert code == 2 and lines == [
        f"jagg train: error: --resume: no run history in {tmp_path / 'none'} (no jagg.db); give --runs-dir"
    ]
    assert not (tmp_path / "none").exists()


def test_the_real_command_line_refuses_a_64_bit_overflow(runs: Path) -> None:
    before = _snapshot(runs)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jagg_engine.cli",
            "train",
            f"seed={BIG}",
            "lora_rank=8",
            "--runs-dir",
            str(runs),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"jagg train: error: seed: must be an integer <= {INT_MAX}, got {BIG}"
    assert _snapshot(runs) == before


def test_max_batch_is_the_documented_limit_a_big_machine_raises() -> None:
    big = TrainConfig().apply_overrides(["group_size=4096", "prompts_per_step=2"])
    with pytest.raises(ConfigError, match=r"over max_batch \(1024\); lower them, or raise max_batch"):
        big.validate(check_environment=False)
    big.apply_overrides(["max_batch=8192"]).validate(check_environment=False)
    # Per process: the same step split over 8 processes fits the default.
    big.apply_overrides(["group_size=512", "prompts_per_step=16", "processes=8"]).validate(
        check_environment=False
    )


# ---------------------------------------------------------------------------------------------- the app


@pytest.fixture
def app(runs: Path) -> Iterator[dict]:
    from app import ui

    demo = ui.build_app(
        runs, background_ticks=False, command=lambda run_id, root: [sys.executable, "-c", "pass"]
    )
    handlers = {f.api_name: f.fn for f in demo.fns.values()}
    try:
        yield handlers
    finally:
        demo.jagg_manager.shutdown()


FORM = {
    "name": "t",
    "backbone": "tiny-shapes",
    "model_path": "",
    "rewards": "shapes-dense: 1",
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
    "overrides": "",
}

APP_FORM_CASES = [
    ("int range", {"steps": float(BIG)}, f"steps: must be an integer <= {INT_MAX}"),
    ("int range", {"window": math.nan}, "W (window): must be an int, got nan"),
    ("int range", {"seed": 1e30}, f"seed: must be an integer <= {INT_MAX}"),
    ("int range", {"processes": -1}, "processes: must be an integer >= 1, got -1"),
    ("int range", {"lr": math.inf}, "lr: must be a finite number, got inf"),
    ("int range", {"name": 5}, "name: must be text, got 5"),
    ("int range", {"rewards": ["shapes"]}, "rewards: must be text, got ['shapes']"),
    ("int range", {"name": "two\nlines"}, "name: must be one line of at most 200 printable characters"),
    (
        "nested types",
        {"overrides": "backbone_options={cfg_scale: big}"},
        "backbone_options.cfg_scale: not allowed",
    ),
    (
        "nested types",
        {"overrides": "backbone_options={train_embeddings: 2}"},
        "backbone_options.train_embeddings:",
    ),
    ("unknown options", {"overrides": "backbone_options={rank: 4}"}, "backbone_options.rank: unknown option"),
    ("ignored", {"overrides": "lora_rank=16"}, "lora_rank: backbone 'tiny-shapes' does not use it"),
    (
        "ignored",
        {"backbone": "tiny-flux", "model_path": str(ASSETS)},
        "model path (model_path): backbone 'tiny-flux' does not",
    ),
    ("utf-8", {"overrides": "prompts_file=<latin1.txt>"}, "prompts_file: <latin1.txt> is not UTF-8 text"),
    (
        "model path",
        {"model_path": "<empty-dir>"},
        "model path (model_path): <empty-dir> holds no tiny-shapes weights",
    ),
    (
        "batch",
        {"group_size": 2048},
        "group size (group_size): group_size × prompts_per_step / processes = 36864",
    ),
]


@pytest.mark.parametrize(
    ("kind", "changes", "message"),
    APP_FORM_CASES,
    ids=[f"{c[0]}:{list(c[1].values())[0]!s:.25}" for c in APP_FORM_CASES],
)
def test_the_app_form_refuses_inline_and_writes_nothing(
    kind, changes, message, files, runs: Path, app
) -> None:
    values = {k: _fill(v, files) if isinstance(v, str) else v for k, v in {**FORM, **changes}.items()}
    before = _snapshot(runs)
    for handler in ("launch_run", "compare_exact_jagg"):
        text, run_id, _ = app[handler](*values.values(), None)  # the last argument: gradio's request
        assert run_id is None and "\n" not in text and "Traceback" not in text
        text = rendered(text)
        assert text == f"**Not launched.** {_fill(message, files)}" or text.startswith(
            f"**Not launched.** {_fill(message, files)}"
        ), text
    assert _snapshot(runs) == before


BAD_RUN_IDS = ["abc", 1.5, math.nan, math.inf, BIG, -1, 0, True, "1e3", [1]]


@pytest.mark.parametrize("bad", BAD_RUN_IDS, ids=repr)
def test_the_app_handlers_refuse_non_integer_run_ids(bad, runs: Path, app) -> None:
    before = _snapshot(runs)
    expected = f"run id: must be a whole number from 1 to {2**63 - 1}, got {bad!r}"
    outputs = {
        "cancel": app["cancel_run"](bad),
        "delete": app["delete_run"](bad, True)[0],
        "export": app["export_run"](bad)[0],
        "live_view": app["live_view"](bad, 1.8)[0],
        "on_tick": app["on_tick"](bad, 1.8, None, None)[0],
        "resume": app["resume_run"](bad),
    }
    for name, text in outputs.items():
        assert rendered(text) == f"**Error:** {expected}", (name, text)
    message = app["compare_runs"]([1, bad], 1.8)[0]  # one line above the panels
    assert rendered(message).startswith(f"**Not shown:** {expected.replace('run id', 'runs')}"), message
    assert _snapshot(runs) == before
    assert open_store(runs).get_run(1)["status"] == "cancelled"  # the run the ids might have hit is intact


def test_the_app_handlers_refuse_a_bad_cost_ratio(runs: Path, app) -> None:
    for bad in ("abc", -1.0, math.nan, 0):
        text = rendered(app["live_view"](1, bad)[0])
        assert text == f"**Error:** r: must be a finite number > 0, got {bad!r}"
        assert rendered(app["compare_runs"]([1, 1], bad)[0]).startswith(
            "**Error:** r: must be a finite number"
        )


# ---------------------------------------------------------------------------------------------- one table


def test_every_backbone_says_which_model_fields_it_uses() -> None:
    """The registry entry is the one table: every option an entry reads from a model field is a parameter of
    the backbone's factory, and backbone_kwargs passes a model field exactly to the backbones that read it
    (elsewhere the validator refuses it instead of the factory ignoring it)."""
    import inspect

    from jagg_engine.backbones import BACKBONES
    from jagg_engine.train.config import MODEL_FIELDS

    changed = {
        "model_path": "/models/x",
        "lora_rank": 8,
        "lora_alpha": 16.0,
        "lora_targets": ["to_q"],
        "gradient_checkpointing": True,
        "precision": "bf16",
        "cfg_scale": 2.5,
        "lora_path": "/models/lora",
    }
    assert set(changed) == set(MODEL_FIELDS)
    for backbone, spec in BACKBONES.items():
        params = inspect.signature(spec.factory_fn()).parameters
        assert set(spec.options) <= set(params), (backbone, set(spec.options) - set(params))
        base = TrainConfig(backbone=backbone).backbone_kwargs()
        for field_name, value in changed.items():
            kwargs = TrainConfig(backbone=backbone, **{field_name: value}).backbone_kwargs()
            assert (kwargs != base) == (field_name in spec.options.values()), (backbone, field_name)


def test_fsdp_is_accepted_with_the_processes_flag(runs: Path, no_training, monkeypatch, capsys) -> None:
    import jagg_engine.train.launch as launch

    launched = []
    monkeypatch.setattr(launch, "launch", lambda argv, env: (launched.append(argv), (0, "", True))[1])
    small = [
        "prompts_per_step=2",
        "group_size=4",
        "sampling_steps=6",
        "sde_window_end=4",
        "eval_num_prompts=4",
    ]
    code, lines = _cli(["train", "fsdp=true", *small, "--processes", "2", "--runs-dir", str(runs)], capsys)
    assert code == 0 and len(launched) == 1 and "--num_processes" in launched[0]
    assert _snapshot(runs)[0] == 2  # the run was created: a valid config is not refused

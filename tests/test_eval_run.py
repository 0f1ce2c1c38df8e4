"""`jagg eval --run` / `--model` on a tiny-shapes run: the run's own eval settings reproduce the eval reward it
logged at each step; `jagg export-model` of tiny-shapes is a model folder that `model_path=` loads; bad input
is one line, exit 2, and nothing written."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from toy import a_trained_and_a_queued_run

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from jagg_engine import cli  # noqa: E402
from jagg_engine.store import open_store  # noqa: E402
from jagg_engine.train.config import load_config  # noqa: E402
from jagg_engine.train.trainer import Trainer  # noqa: E402

SMALL = [
    "steps=2",
    "prompts_per_step=2",
    "group_size=4",
    "sampling_steps=6",
    "sde_window_end=4",
    "eval_num_prompts=3",
    "eval_seeds=[0, 2]",
    "eval_every=1",
    "sample_every=0",
    "checkpoint_every=1",
    "keep_checkpoints=3",
    "lr=3e-4",  # the eval reward moves within two steps (1e-3 drives it to the floor at once)
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run 1: two tiny-shapes steps with an eval and a checkpoint at every step; run 2: queued, never trained."""
    return a_trained_and_a_queued_run(tmp_path_factory.mktemp("runs"), SMALL)


def logged(runs: Path, step: int, key: str = "eval/reward/mean") -> float:
    frame = open_store(runs).metrics_frame(1)
    return float(frame.loc[frame["step"] == step, key].item())


def jagg(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's refusal of a flag's value
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def eval_json(capsys, *argv: str) -> dict:
    code, out, err = jagg(capsys, "eval", *argv, "--device", "cpu", "--json")
    assert code == 0, err
    (line,) = out.strip().splitlines()  # one object on stdout
    return json.loads(line)


def test_eval_run_reproduces_the_logged_eval_reward_at_each_step(runs: Path, capsys) -> None:
    rewards = []
    for step in (0, 1, 2):
        got = eval_json(capsys, "--run", "1", "--step", str(step), "--runs-dir", str(runs))
        assert got["step"] == step and got["samples"] == 6 and got["seeds"] == [0, 2]
        assert got["reward_mean"] == pytest.approx(logged(runs, step), abs=1e-4)
        assert got["reward_std"] == pytest.approx(logged(runs, step, "eval/reward/std"), abs=1e-4)
        assert got["rewards"]["shapes-dense"] == pytest.approx(
            logged(runs, step, "eval/reward/shapes-dense/mean"), abs=1e-4
        )
        rewards.append(got["reward_mean"])
    assert len(set(rewards)) == 3  # the steps' weights differ: each step's own checkpoint was evaluated
    last = eval_json(capsys, "--run", "1", "--runs-dir", str(runs))  # default: the last checkpoint
    assert last["step"] == 2 and last["reward_mean"] == pytest.approx(rewards[-1], abs=1e-6)
    # flags override the run's settings
    other = eval_json(capsys, "--run", "1", "--runs-dir", str(runs), "--seeds", "1", "--steps", "3")
    assert other["seeds"] == [0] and other["sampling_steps"] == 3 and other["samples"] == 3


def test_export_of_tiny_shapes_is_a_model_folder_eval_reproduces(runs: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "aligned"
    code, stdout, err = jagg(
        capsys, "export-model", "1", "--step", "1", "--out", str(out), "--runs-dir", str(runs)
    )
    assert code == 0, err
    assert {p.name for p in out.iterdir()} >= {
        "README.md",
        "jagg_run.json",
        "reward_curve.png",
        "transformer",
        "text_embedding.safetensors",
        "vocab.json",
    }
    got = eval_json(capsys, "--model", str(out))
    assert got["step"] == 1 and got["reward_mean"] == pytest.approx(logged(runs, 1), abs=1e-4)
    card = (out / "README.md").read_text()
    assert card.startswith("---\nbase_model: tiny-shapes\nlibrary_name: diffusers\n")
    assert f"| eval reward, step 0 | {logged(runs, 0):.4f} |" in card
    assert f"| eval reward, step 1 | {logged(runs, 1):.4f} |" in card

    # model_path=DIR: training goes on from the export (its weights are the checkpoint's)
    from jagg_engine.export import build_model, load_run_model, open_run

    cfg = load_config(None, [*SMALL, f"model_path={out}"])
    exported = build_model(cfg).trainable_parameters()
    checkpointed = load_run_model(open_run(runs, 1), 1).trainable_parameters()
    base = build_model(dataclasses.replace(cfg, model_path=None)).trainable_parameters()
    assert all(torch.equal(a, b) for a, b in zip(exported, checkpointed))
    assert any(not torch.equal(a, b) for a, b in zip(exported, base))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export-model", "2", "--out", "{out}"], "RUN: run 2 has no checkpoint in "),
        (["export-model", "9", "--out", "{out}"], "RUN: no run 9 in "),
        (
            ["export-model", "1", "--step", "5", "--out", "{out}"],
            "--step: run 1 has no checkpoint at step 5; its checkpoints: 1, 2",
        ),
        (
            ["export-model", "1", "--out", "{full}"],
            "exists and is not an empty folder; pass a new or empty folder",
        ),
        (["export-model", "1", "--merge", "--out", "{out}"], "--merge: run 1 is a tiny-shapes run"),
        (["export-model", "x1", "--out", "{out}"], "RUN: must be a run id (a whole number), got 'x1'"),
        (["eval", "--model", "{runs}"], "not a jagg export (no jagg_run.json)"),
        (["eval", "--run", "9"], "RUN: no run 9 in "),
        (["eval", "--run", "1", "--step", "5"], "--step: run 1 has no checkpoint at step 5"),
        (["eval", "--run", "2"], "RUN: run 2 has no checkpoint"),
        (["sample", "1", "--prompts-file", "{full}/keep.txt", "--out", "{out}.png"], "is not JSON"),
        (
            ["sample", "1", "--prompts-file", "{out}.json", "--out", "{out}.png"],
            "--prompts-file: cannot read",
        ),
        (
            ["sample", "1", "--prompt", "red circle left", "--prompts-file", "{full}", "--out", "{out}.png"],
            "argument --prompts-file: not allowed with argument --prompt",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(
    runs: Path, tmp_path: Path, capsys, argv: list[str], message: str
) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    argv = [a.format(out=out, full=full, runs=runs) for a in argv]
    code, stdout, err = jagg(capsys, *argv, "--runs-dir", str(runs))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"jagg {argv[0]}: error: "), err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["full"]
    assert [p.name for p in full.iterdir()] == ["keep.txt"]


def test_export_model_on_a_full_disk_is_one_line_and_leaves_nothing(runs: Path, mounts, tmp_path, capsys):
    """--out on a 3 MiB tmpfs (a tiny-shapes export is ~9 MB): one line naming what was being written, exit
    code 1 as a run that fails on a full disk; the filesystem as it was (no partial folder, no --out)."""
    full = mounts("-t", "tmpfs", "-o", "size=3m", "tmpfs", str(tmp_path / "full"))
    (full / "keep.txt").write_text("mine")
    code, stdout, err = jagg(
        capsys, "export-model", "1", "--out", str(full / "a" / "model"), "--runs-dir", str(runs)
    )
    assert code == 1 and stdout == "", (code, err)
    # the line names the user's --out (what was being written, there), not the hidden folder it was removed from
    assert err.startswith(f"jagg export-model: error: disk full: {full / 'a' / 'model'}"), err
    assert ".partial-" not in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in full.iterdir()) == ["keep.txt"]  # nor the folder a/ it made


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    "where",
    [
        "run-0003",
        "run-0001/checkpoints/step_00009",
        "run-0001/x",
        "exports/x",
        "link/x",
        "{runs}/../{name}/y",
    ],
)
def test_export_model_out_inside_the_runs_folder_is_refused_in_one_line(
    runs: Path, tmp_path: Path, capsys, where: str
) -> None:
    """--out anywhere under the runs folder (a name reindex would read as a run's, a checkpoint's, inside a run
    folder, through a symlink or ``..``): one line naming --out and the folder, exit 2, nothing written."""
    link = tmp_path / "link"
    link.symlink_to(runs / "run-0001")
    out = (tmp_path / where) if where.startswith("link/") else Path(where.format(runs=runs, name=runs.name))
    out = out if out.is_absolute() else runs / out
    before = tree(runs)
    code, stdout, err = jagg(capsys, "export-model", "1", "--out", str(out), "--runs-dir", str(runs))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"jagg export-model: error: --out: {out} is inside the runs folder "), err
    assert "pass a folder outside it" in err
    assert tree(runs) == before


def export_argv(runs: Path) -> list[str]:
    """`jagg export-model 1 --runs-dir RUNS --out` as a subprocess's argv (the folder comes last)."""
    import sys

    return [sys.executable, "-m", "jagg_engine.cli", "export-model", "1", "--runs-dir", str(runs), "--out"]


def _has_bytes(folder: Path) -> bool:
    """A file with bytes in it under ``folder`` (the export's folder exists before its weights do: a kill
    between the two left an empty partial in the fresh-clone CI run of 1ee3309)."""
    try:
        return any(p.is_file() and p.stat().st_size > 0 for p in folder.rglob("*"))
    except OSError:  # renamed away or being written meanwhile
        return False


def kill_an_export_mid_write(runs: Path, folder: Path) -> tuple[Path, int]:
    """`jagg export-model --out FOLDER/aN` killed with SIGKILL once its weights are written and before the rename
    (up to 5 tries): the ``.aN.partial-PID/`` it leaves, and the try that left it."""
    import signal
    import subprocess

    from polling import wait_for

    for attempt in range(5):
        proc = subprocess.Popen([*export_argv(runs), str(folder / f"a{attempt}")], stderr=subprocess.PIPE)
        partial = folder / f".a{attempt}.partial-{proc.pid}"
        written = lambda p=partial, w=proc: _has_bytes(p / "transformer") or w.poll() is not None  # noqa: E731
        wait_for(written, timeout=300, every=0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if partial.is_dir():
            break
    assert partial.is_dir() and proc.returncode == -signal.SIGKILL, "no kill landed mid-export in 5 tries"
    return partial, attempt


def test_a_partial_export_left_by_kill_9_is_removed_by_the_next_export(runs: Path, tmp_path: Path) -> None:
    """`jagg export-model` killed with SIGKILL while it writes leaves ``.NAME.partial-PID/``; the next export
    into the same folder removes it (its process is gone) and a live export's partial is left alone."""
    import subprocess

    folder = tmp_path / "exports"
    folder.mkdir()
    partial, attempt = kill_an_export_mid_write(runs, folder)
    size = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
    assert size > 0  # what the issue saw: megabytes left behind
    live = folder / f".b.partial-{os.getppid()}"  # a live process's partial export (this test's parent)
    live.mkdir()
    done = subprocess.run(
        [*export_argv(runs), str(folder / "b")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert not partial.exists() and live.is_dir()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [live.name, "b", *(f"a{i}" for i in range(attempt) if (folder / f"a{i}").exists())]
    )


def test_reindex_removes_a_partial_export_left_by_kill_9_beside_out(
    runs: Path, tmp_path: Path, capsys
) -> None:
    """`jagg export-model --out` outside the runs folder, killed with SIGKILL while it writes, leaves
    ``.NAME.partial-PID/`` beside --out; `jagg reindex` of the runs folder removes it (the export left a note of
    it in the runs folder), naming it in one line, and leaves a live export's partial alone."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    partial, _ = kill_an_export_mid_write(runs, folder)
    live = folder / f".b.partial-{os.getppid()}"  # a live process's partial, noted as an export notes one
    from jagg_engine import export_format

    pending = runs / export_format.PENDING
    (pending / f"{os.getppid()}-live").write_text(str(live))
    live.mkdir()
    code, out, err = jagg(capsys, "reindex", "--runs-dir", str(runs))
    assert code == 0, err
    assert f"removed {partial}: the partial export of a process that is gone" in out.splitlines()
    assert not partial.exists() and live.is_dir()
    assert [p.name for p in pending.iterdir()] == [f"{os.getppid()}-live"]  # the gone export's note went too
    (pending / f"{os.getppid()}-live").unlink()


def test_reindex_removes_the_apps_zip_left_by_kill_9(runs: Path, tmp_path: Path) -> None:
    """The app zips an export into ``<runs>/exports`` as a partial file renamed when whole; a process killed
    with SIGKILL while zipping leaves it, and `jagg reindex` removes it, naming it in one line."""
    import signal
    import subprocess
    import sys

    from polling import wait_for

    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    exports = copy / "exports"
    exports.mkdir(exist_ok=True)
    work = tmp_path / "work"
    (work / "m").mkdir(parents=True)
    for i in range(40):  # incompressible: zipping takes a while
        (work / "m" / f"{i}.bin").write_bytes(os.urandom(1 << 20))
    code = "import sys; from pathlib import Path; from app.tryit import TryIt; TryIt._zip(*map(Path, sys.argv[1:4]))"
    proc = subprocess.Popen([sys.executable, "-c", code, str(work), "m", str(exports)])
    zipped = lambda: [p for p in exports.iterdir() if p.name.endswith(f".partial-{proc.pid}.zip")]  # noqa: E731
    assert wait_for(lambda: any(p.stat().st_size > 1 << 20 for p in zipped()), timeout=120, every=0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (left,) = zipped()
    done = subprocess.run(
        [sys.executable, "-m", "jagg_engine.cli", "reindex", "--runs-dir", str(copy)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"removed {left}: the partial export of a process that is gone" in done.stdout.splitlines()
    assert not left.exists() and list(exports.iterdir()) == []


NESTED = "[" * 200_000 + "]" * 200_000  # deeper than json's recursion limit


def test_a_deeply_nested_export_file_is_refused_in_one_line(runs: Path, tmp_path: Path, capsys) -> None:
    """An export whose jagg_run.json (or, past it, whose vocab.json) is 200 k nested brackets: `jagg eval
    --model` and `jagg sample --model` end with one line naming the file, exit 2, no RecursionError."""
    out = tmp_path / "export"
    assert jagg(capsys, "export-model", "1", "--out", str(out), "--runs-dir", str(runs))[0] == 0
    info = (out / "jagg_run.json").read_text()
    grid = tmp_path / "grid.png"
    sample = ["sample", "--model", str(out), "--prompt", "red circle left", "--out", str(grid)]
    for name, text, said in (
        ("jagg_run.json", NESTED, f"--model: {out / 'jagg_run.json'}: unreadable (nested too deeply)"),
        (
            "vocab.json",
            '{"vocabulary": ' + NESTED + "}",
            f"{out / 'vocab.json'}: unreadable (nested too deeply)",
        ),
    ):
        (out / "jagg_run.json").write_text(info)
        (out / name).write_text(text)
        for argv in (["eval", "--model", str(out), "--device", "cpu"], sample):
            code, stdout, err = jagg(capsys, *argv)
            assert code == 2 and said in err and len(err.splitlines()) == 1, (argv, err)
            assert "Traceback" not in err and not grid.exists()


def test_sample_draws_the_eval_noise_and_captions_each_reward(runs: Path, tmp_path: Path, capsys) -> None:
    """`jagg sample` of the run's eval prompts and seeds gives the images (their rewards) the eval logged; with
    --with-base the base model samples the same noise beside."""
    from PIL import Image

    store = open_store(runs)
    evals = [s for s in store.samples(1, kind="eval") if s["step"] == 1]
    prompts = list(dict.fromkeys(s["prompt"] for s in sorted(evals, key=lambda s: s["path"])))
    out = tmp_path / "grid.png"
    argv = ["sample", "1", "--step", "1", "--with-base", "--prompt", *prompts, "--seeds", "0,2"]
    code, stdout, err = jagg(
        capsys, *argv, "--out", str(out), "--runs-dir", str(runs), "--device", "cpu", "--json"
    )
    assert code == 0, err
    summary = json.loads(stdout)
    base, trained = summary["models"]
    assert base["label"] == "base" and trained["label"] == "run 1 step 1"
    logged_rewards = {(s["prompt"], s["seed"]): s["reward"] for s in evals}
    got = {(i["prompt"], i["seed"]): i["reward"] for i in trained["images"]}
    assert got.keys() == logged_rewards.keys()
    for key, value in got.items():
        assert value == pytest.approx(logged_rewards[key], abs=1e-4), key
    assert base["reward_mean"] == pytest.approx(logged(runs, 0), abs=1e-4)  # the base is step 0's model
    grid = Image.open(out)
    assert grid.size[0] > 4 * 128 and grid.size[1] > 3 * 128  # 3 prompt rows, 2 models × 2 seeds
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the temporary file is gone

    code, _, err = jagg(
        capsys, "sample", "1", "--prompt", "purple cat dog", "--out", str(out), "--runs-dir", str(runs)
    )
    assert (
        code == 2
        and "--prompt: tiny-shapes: unknown word 'purple'" in err
        and len(err.strip().splitlines()) == 1
    )


def test_study_cosine_measures_a_runs_model_at_a_checkpoint_on_the_runs_own_sampler(runs, tmp_path, capsys):
    from jagg_engine.train.trainer import sampler_config

    out = tmp_path / "cosine"
    common = ["study", "cosine", "--runs-dir", str(runs), "--batches", "1", "--batch", "8", "--out", str(out)]
    results = {}
    for step in (0, 2):
        code, text, _ = jagg(capsys, *common, "--run", "1", "--step", str(step))
        assert code == 0, text
        assert f"Gradient cosine by group: run 1 step {step}, W = 4, trained steps 0:4 of 6" in text
        assert "advantages from shapes-dense (groups of 4)" in text
        results[step] = json.loads((out / f"cosine-run1-step{step}.json").read_text())
    cfg = load_config(None, SMALL)
    grid = sampler_config(cfg, None, 2).grid()  # the trainer's own builder: 4 SDE steps, then 2 ODE steps
    for step, result in results.items():
        assert result["subject"] == f"run 1 step {step}" and result["trained_steps"] == [0, 4]
        (group,) = result["groups"]
        assert group["t_start"] == pytest.approx(float(grid.sigmas[0]))
        assert group["t_end"] == pytest.approx(float(grid.sigmas[3]))
        assert -1.0 <= group["cosine_mean"] <= 1.0 and group["rel_error_mean"] >= 0.0
    # the same rollout seeds, another model: the trained weights give other gradients than the base's
    assert results[0]["groups"][0]["rel_error_mean"] != results[2]["groups"][0]["rel_error_mean"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--run", "1", "--window", "4"], "--window: with --run the run's own is measured; leave it out"),
        (
            ["--run", "1", "--sde-window", "0:4"],
            "--sde-window: with --run the run's own is measured; leave it out",
        ),
        (["--step", "1"], "--step: only with --run"),
        (["--run", "1", "--step", "7"], "--step: run 1 has no checkpoint at step 7; its checkpoints: 1, 2"),
    ],
)
def test_study_cosine_of_a_run_refuses_flags_that_contradict_it(runs, tmp_path, capsys, argv, line):
    out = tmp_path / "cosine"
    code, _, err = jagg(capsys, "study", "cosine", "--runs-dir", str(runs), "--out", str(out), *argv)
    assert code == 2 and err.strip() == f"jagg study: error: {line}"
    assert not out.exists()


# A run name and a base-model folder of a hostile user's making: an image and links, a heading, a table cell's
# end, a code fence, a bare URL, HTML, emphasis.
HOSTILE_NAME = "# <img src=//HOST/t.png>[x](/y) ![i](//HOST/i.png) a|b ``` https://HOST/u <b>bold</b> *em*"
HOSTILE_FOLDER = "m` <img src=x>[l](/y) |c| ```"


def test_a_hostile_run_name_and_model_path_are_literal_text_in_the_model_card(tmp_path: Path, capsys) -> None:
    """A real one-step run named with markup, trained from a copy of the base model in a folder named with
    markup, exported; its card (less its front matter, as the Hub shows it) rendered by a CommonMark renderer
    with HTML and tables: the heading is the name's literal text, no element and no link comes from either
    string, and the card's code reads the folder as one Python string."""
    import ast

    import yaml
    from markdown_it import MarkdownIt

    base = tmp_path / HOSTILE_FOLDER
    shutil.copytree(Path(__file__).resolve().parents[1] / "assets" / "tiny-shapes", base)
    cfg = dataclasses.replace(load_config(None, [*SMALL, "steps=1"]), model_path=str(base))
    runs = tmp_path / "runs"
    store = open_store(runs)
    run_id = store.create_run(HOSTILE_NAME, cfg.to_dict(), runs / "run-0001")
    assert Trainer(cfg, run_id, str(runs)).run() == "finished"
    out = tmp_path / "export"
    code, _, err = jagg(capsys, "export-model", str(run_id), "--out", str(out), "--runs-dir", str(runs))
    assert code == 0, err
    _, front, body = (out / "README.md").read_text(encoding="utf-8").split("---\n", 2)
    assert yaml.safe_load(front)["base_model"] == str(base)

    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    tokens = md.parse(body)
    inline = [c for t in tokens if t.type == "inline" for c in t.children]
    assert tokens[0].type == "heading_open" and tokens[0].tag == "h1"
    assert [c.type for c in tokens[1].children] == ["text"]  # no element, link, image or emphasis
    assert tokens[1].children[0].content == f"{HOSTILE_NAME} (JAGG Studio run {run_id}, step 1)"
    assert not [t.type for t in [*tokens, *inline] if t.type in ("html_block", "html_inline", "em_open")]
    images = [c.attrs["src"] for c in inline if c.type == "image"]
    assert images == ["reward_curve.png", "before_after.png"] and not [
        c for c in inline if c.type == "link_open"
    ]
    assert [t.type for t in tokens].count("heading_open") == 2  # the name's and "## Use"
    cells = [t.type for t in tokens if t.type in ("tr_open", "th_open", "td_open")]
    assert cells.count("tr_open") * 2 == len(cells) - cells.count("tr_open")  # every row: two cells
    paragraph = next(t.content for t in tokens if t.type == "inline" and "GRPO alignment of" in t.content)
    shown = "".join(c.content for c in next(t for t in tokens if t.content == paragraph).children)
    assert f"GRPO alignment of {base} (tiny-shapes)" in shown  # the folder's literal text
    (code_block,) = [t for t in tokens if t.type == "fence"]  # the folder's ``` did not end the code
    assert code_block.info == "python" and "build_backbone" in code_block.content
    html = md.render(body)
    assert "<img src=//HOST" not in html and "<b>" not in html and 'href="/y"' not in html

    # a LoRA card names its base inside the code: the folder stays one Python string there
    from jagg_engine.export import model_card

    info = json.loads((out / "jagg_run.json").read_text(encoding="utf-8"))
    lora = {
        **info,
        "kind": "lora",
        "backbone": "flux",
        "base_model": f"{base}\n```\n# <img src=//HOST/l.png>",
    }
    tokens = md.parse(model_card(lora, {}).split("---\n", 2)[2])
    (code_block,) = [t for t in tokens if t.type == "fence"]
    (call,) = [line for line in code_block.content.splitlines() if ".from_pretrained(" in line]
    assert ast.literal_eval(call.split("from_pretrained(", 1)[1].rstrip(")")) == lora["base_model"]
    assert not [t for t in tokens if t.type == "html_block"]

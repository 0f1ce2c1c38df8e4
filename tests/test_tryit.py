"""The Try it tab's and Export model's handlers (app.tryit) over a real one-step tiny-shapes run with a
checkpoint: the worker subprocess draws base and run from the eval's noise (the rewards the eval logged),
shows its phases, is cancelled or stopped with its whole process group, and refuses bad input in one line
naming the field; Export model zips the `jagg export-model` folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from toy import a_trained_and_a_queued_run

from app import tryit
from app.runs import group_alive
from jagg_engine.store import open_store

pytestmark = pytest.mark.slow  # a real training step, and workers that import torch

SMALL = [
    "steps=1",
    "prompts_per_step=2",
    "group_size=4",
    "sampling_steps=6",
    "sde_window_end=4",
    "eval_num_prompts=2",
    "eval_seeds=[0, 2]",
    "eval_every=1",
    "sample_every=0",
    "checkpoint_every=1",
    "lr=1e-3",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run 1: one tiny-shapes step, evals and checkpoints at steps 0 and 1; run 2: queued, never trained."""
    return a_trained_and_a_queued_run(tmp_path_factory.mktemp("runs"), SMALL)


def make(runs: Path, space: bool = False) -> tryit.TryIt:
    store = open_store(runs)
    return tryit.TryIt(SimpleNamespace(store=store, root=runs, space=space, publish=str))


def request(session: str) -> SimpleNamespace:
    return SimpleNamespace(session_hash=session)


def eval_samples(runs: Path, step: int) -> dict[tuple[str, int], float]:
    with open_store(runs) as store:
        return {(s["prompt"], s["seed"]): s["reward"] for s in store.samples(1, "eval") if s["step"] == step}


def last(generator) -> tuple:
    return list(generator)[-1]


def test_try_it_draws_base_and_run_from_the_same_noise_with_the_rewards_the_eval_logged(runs: Path) -> None:
    h = make(runs)
    assert [run_id for _, run_id in h.run_choices()] == [1]  # #2 has no checkpoint
    assert h.initial()[1:] == (1, [1])  # step 0 is the base model, beside every try
    assert h.steps_of(1)["choices"] == [1] and h.steps_of(1)["value"] == 1
    run_picker, step_picker = h.load_pickers()
    assert run_picker["value"] == 1 and step_picker == {**h.steps_of(1)}
    assert (
        h.refresh_steps(1, 1)["value"] == 1 and h.refresh_steps(1, 7)["value"] == 1
    )  # a step gone: the last
    assert h.steps_of(2)["choices"] == [] and h.steps_of("nope")["choices"] == []
    prompts = sorted({p for p, _ in eval_samples(runs, 1)})
    shown = list(h.generate(1, None, "\n".join(prompts) + "\n\n", "0, 2", request("a")))
    messages = [m for m, *_ in shown]
    assert messages[0] == "Starting: base and run #1 at step 1…"
    working = [m for m in messages if m.startswith("Working (")]
    assert any("loading the models" in m or "sampling" in m for m in working), messages
    message, base, trained = shown[-1]
    assert message.startswith("Same prompts and noise: base (mean reward ") and "run #1 at step 1" in message
    for gallery, step, label in ((base, 0, "base"), (trained, 1, "run")):
        assert gallery["columns"] == 2
        items = gallery["value"]
        assert len(items) == 4, label
        logged = eval_samples(runs, step)  # the run's step-0 eval is its base model
        for path, caption in items:
            assert Path(path).is_file() and Path(path).is_relative_to(tryit.tryit_root())
            prompt, seed, reward = caption.split(" · ")
            seed_n = int(seed.removeprefix("seed "))
            assert float(reward.removeprefix("reward ")) == pytest.approx(logged[(prompt, seed_n)], abs=1e-3)
    assert base["value"][0][0] != trained["value"][0][0]
    # a new try of the session replaces the previous one's files
    first = Path(base["value"][0][0])
    assert last(h.generate(1, 1, prompts[0], "2", request("a")))[0].startswith("Same prompts and noise")
    assert not first.exists()


def test_cancel_kills_the_worker_group_and_another_visitor_may_not(runs: Path) -> None:
    h = make(runs, space=True)
    gen = h.generate(1, 1, "red circle", "0", request("owner-of-it"))
    assert next(gen)[0].startswith("Starting")
    worker = h.workers.current()
    assert worker is not None and worker.proc.poll() is None
    busy = last(h.generate(1, 1, "red circle", "0", request("other")))
    assert busy[0].startswith("**Not started.** a Try it is running (started ")
    assert h.cancel(request("other")).startswith("**Refused.** another visitor's worker is running")
    assert worker.proc.poll() is None
    assert h.cancel(request("owner-of-it")) == "Cancelled."
    assert not group_alive(worker.proc.pid)
    assert last(gen)[0] == "Cancelled: the worker was stopped."
    assert h.cancel(request("owner-of-it")).startswith("Nothing to cancel")


def test_a_page_that_goes_away_takes_its_worker_with_it(runs: Path) -> None:
    h = make(runs)
    gen = h.generate(1, 1, "red circle", "0", request("gone"))
    next(gen)
    worker = h.workers.current()
    next(gen)  # a progress line: the worker runs
    gen.close()  # gradio closes the generator of a page that went away
    assert worker.proc.poll() is not None and not group_alive(worker.proc.pid)


@pytest.mark.parametrize(
    "args, said",
    [
        ((2, None, "red circle", "0"), "**Not started.** run #2 has no checkpoint"),
        ((99, None, "red circle", "0"), "**Not started.** run: no run #99"),
        ((None, None, "red circle", "0"), "**Not started.** run: pick a run with a checkpoint"),
        (("#1 nope", None, "red circle", "0"), "**Not started.** run: "),
        ((1, 5, "red circle", "0"), "**Not started.** step: run #1 has checkpoints at steps 1, got 5"),
        ((1, 0.5, "red circle", "0"), "**Not started.** step: run #1 has checkpoints at steps 1, got 0.5"),
        ((1, None, " \n ", "0"), "**Not started.** prompts: type at least one prompt (one a line)"),
        ((1, None, "a\nb\nc\nd\ne", "0"), "**Not started.** prompts: at most 4 a try, got 5"),
        ((1, None, "red circle", "0,1,2,3,4"), "**Not started.** seeds: at most 4 a try, got 5"),
        ((1, None, "red circle", "1, 1"), "**Not started.** seeds: must be distinct, got '1, 1'"),
        (
            (1, None, "red circle", "-1"),
            "**Not started.** seeds: must be whole numbers >= 0 like 0, 1, got '-1'",
        ),
        ((1, None, "red circle", ""), "**Not started.** seeds: must be whole numbers >= 0 like 0, 1, got ''"),
        ((1, None, None, "0"), "**Not started.** prompts: must be text, one prompt a line, got None"),
    ],
)
def test_bad_input_is_one_line_naming_the_field_and_starts_nothing(runs: Path, args, said) -> None:
    h = make(runs, space=True)  # the Space's caps: 4 prompts, 4 seeds
    (message, base, trained) = last(h.generate(*args, request("v")))
    assert message.startswith(said) and "\n" not in message, message
    assert h.workers.current() is None


def test_a_word_outside_the_vocabulary_is_one_line_naming_prompts_before_any_model_loads(runs: Path) -> None:
    """Refused by the app against the models' vocabulary, before a worker starts (which loads both models
    first): the same words as the worker's refusal."""
    h = make(runs)
    h.workers = RecordingWorkers()
    message, base, trained = last(h.generate(1, None, "red circle\npurple <b>circle</b>", "0", request("w")))
    assert message.startswith("**Not started.** prompts: tiny-shapes: unknown word 'purple'"), message
    assert "\n" not in message and "\\<b>" in message  # the typed text is escaped
    assert h.workers.argvs == []  # no worker started, no model loaded
    message, *_ = last(h.generate(1, None, "red circle top left", "0", request("w")))
    assert message.startswith("**Not started.** prompts: tiny-shapes: a prompt has at most 3 words"), message
    assert h.workers.argvs == []


class RecordingWorkers(tryit.Workers):
    """The app's workers, each command line kept: the worker still runs, as the app starts it."""

    def __init__(self) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []

    def start(self, argv: list[str], kind: str, session: str | None, folder: Path) -> tryit.Worker:
        self.argvs.append(list(argv))
        return super().start(argv, kind, session, folder)


# The prompt lines of the re-walk that became the worker's flags (another reward, a run until cancelled, a
# traceback, a step past the picker, a model download on a Space), and more flags of `jagg sample`.
HOSTILE = [
    "--reward", "brightness", "--steps", "100000", "--device", "meta", "--step 7", "--reward", "pickscore",
    "--steps=3", "-h", "--json", "--out", "/tmp/x.png", "--prompts-file",
]  # fmt: skip


def test_a_prompt_line_that_reads_as_a_flag_is_refused_as_a_prompt_before_any_worker(runs: Path) -> None:
    """The hostile lines typed into Try it: read as prompts (the model's vocabulary refuses the first one, in
    one line naming prompts) before any worker starts; the worker's command of a plain prompt holds the app's
    run, step, seeds, reward, steps and device, and the typed text only in its prompts file."""
    from jagg_engine import cli
    from jagg_engine.sample import read_prompts

    workers = RecordingWorkers()
    h = tryit.TryIt(SimpleNamespace(store=open_store(runs), root=runs, space=False, publish=str), workers)
    plain = last(h.generate(1, 1, "red circle left", "0", request("p")))
    assert plain[0].startswith("Same prompts and noise"), plain[0]
    assert len(HOSTILE) <= h.caps["prompts"]
    message, base, trained = last(h.generate(1, 1, "\n".join(HOSTILE), "0", request("p")))
    (template,) = workers.argvs  # refused before any worker: only the plain prompt's ran
    args = cli.build_parser().parse_args(template[3:])
    assert (args.command, args.run_id, args.step, args.model, args.with_base) == ("sample", 1, 1, None, True)
    assert (args.reward, args.steps, args.device, args.seeds, args.prompt) == (None, None, "auto", "0", None)
    assert read_prompts(args) == ["red circle left"]
    assert "prompts: tiny-shapes: " in message and "\n" not in message, message
    assert "'--reward'" in message.replace("\\", ""), message  # the first line, read as a prompt
    assert base == trained == {"__type__": "update"}  # the galleries left as they were: nothing sampled


def test_workers_one_at_a_time_and_a_worker_past_its_seconds_is_killed(tmp_path: Path) -> None:
    workers = tryit.Workers()
    sleeper = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
               "'import time; time.sleep(60)']); time.sleep(60)"]  # fmt: skip
    worker = workers.start(sleeper, "export", None, tmp_path / "w")
    with pytest.raises(tryit.TryItError, match=r"^a model export is running \(started \d+ s ago\)"):
        workers.start([sys.executable, "-c", "pass"], "try", None, tmp_path / "x")
    time.sleep(0.5)  # its child started: the group has two processes
    assert tryit.wait(worker, seconds=0.2) is False
    assert not group_alive(worker.proc.pid)
    done = workers.start([sys.executable, "-c", "pass"], "try", None, tmp_path / "y")  # the slot is free
    assert tryit.wait(done, seconds=30) and done.proc.returncode == 0


def test_refusal_names_the_tabs_field() -> None:
    err = "progress: loading the models\njagg sample: error: --seeds: must be distinct\n"
    assert tryit.refusal(err, "sample") == "seeds: must be distinct"
    assert tryit.refusal("Traceback …\nRuntimeError: boom\n", "sample") == "RuntimeError: boom"
    assert tryit.refusal("progress: loading the models\n", "sample") == ""


def test_export_model_zips_the_export_folder_with_its_model_card(runs: Path, tmp_path: Path) -> None:
    h = make(runs)
    message, update = h.export_model(1.0, request("e"))
    assert (
        message.startswith("Exported run #1 at step 1: jagg-model-run1-step1.zip (") and "\n" not in message
    )
    assert update["visible"] is True
    archive = Path(update["value"])
    assert archive == runs / "exports" / "jagg-model-run1-step1.zip"
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        assert {"jagg-model-run1-step1/README.md", "jagg-model-run1-step1/jagg_run.json"} <= names
        card = z.read("jagg-model-run1-step1/README.md").decode()
    assert card.startswith("---\nbase_model: tiny-shapes\nlibrary_name: diffusers\n")
    assert [p.name for p in (runs / "exports").iterdir()] == [archive.name]  # the work folder is gone
    # the zip loads back: unpacked, `jagg eval --model` reads it
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "jagg_engine.cli", "eval", "--model", str(tmp_path / "jagg-model-run1-step1"),
         "--device", "cpu", "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"step": 1' in proc.stdout

    for run_id, said in (
        (2, "**Not exported.** run #2 has no checkpoint"),
        (None, "**Not exported.** run id: pick a run with a checkpoint"),
        (1.5, "**Not exported.** run id: must be a whole number"),
    ):
        message, update = h.export_model(run_id, request("e"))
        assert message.startswith(said) and update["visible"] is False, message


def test_the_showcases_shipped_model_is_tried_and_exported_without_a_checkpoint(
    runs: Path, tmp_path: Path
) -> None:
    """A showcase ships its JAGG run's export, not a checkpoint: installed, Try it offers the export's step and
    samples it (``jagg sample --model``) beside the base, with the rewards the trained run logged; a Space
    visitor may try it; Export model zips the shipped folder as it is."""
    from app import showcase

    export = tmp_path / "export"
    cli = [sys.executable, "-m", "jagg_engine.cli"]
    proc = subprocess.run(
        [*cli, "export-model", "1", "--step", "1", "--out", str(export), "--runs-dir", str(runs)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open_store(runs) as store:
        store.set_status(1, "finished")  # as `jagg train` ends it (a showcase is of finished runs)
        # an export of another run is refused
        alien = tmp_path / "alien"
        shutil.copytree(export, alien)
        info = json.loads((alien / "jagg_run.json").read_text())
        (alien / "jagg_run.json").write_text(json.dumps({**info, "run": {**info["run"], "uid": "f" * 32}}))
        with pytest.raises(ValueError, match="models: jagg: .* is an export of run f+, not of run 1"):
            showcase.pack(store, {"exact": 1, "jagg": 1}, tmp_path / "bad", models={"jagg": alien})
        with pytest.raises(ValueError, match="past the shipped steps"):
            showcase.pack(
                store, {"exact": 1, "jagg": 1}, tmp_path / "bad", max_step=0, models={"jagg": export}
            )
        packed = tmp_path / "showcase"
        manifest = json.loads(
            showcase.pack(store, {"exact": 1, "jagg": 1}, packed, models={"jagg": export}).read_text()
        )
    assert [r.get("model", {}).get("step") for r in manifest["runs"]] == [None, 1]
    assert (packed / "models" / "jagg" / "jagg_run.json").is_file()
    site = tmp_path / "site"
    with open_store(site) as store:
        exact_id, jagg_id = showcase.install(store, site, packed)
        jagg_dir = Path(store.get_run(jagg_id)["run_dir"])
    assert showcase.shipped_model(jagg_dir) == (1, jagg_dir / "model")
    assert not (jagg_dir / "checkpoints").exists()
    h = make(site, space=True)
    assert [run_id for _, run_id in h.run_choices()] == [jagg_id]  # the exact one ships no model
    assert h.steps_of(jagg_id)["choices"] == [1]
    argv = tryit.sample_command(
        jagg_id, 1, tmp_path / tryit.PROMPTS_FILE, [0], tmp_path, site, tryit.shipped_at(jagg_dir, 1)
    )
    assert argv[argv.index("sample") + 1 : argv.index("sample") + 3] == ["--model", str(jagg_dir / "model")]
    prompt = sorted({p for p, _ in eval_samples(runs, 1)})[0]
    message, base, trained = last(h.generate(jagg_id, 1, prompt, "0, 2", request("visitor")))
    assert message.startswith("Same prompts and noise: base (mean reward "), message
    for gallery, step in ((base, 0), (trained, 1)):
        logged = eval_samples(runs, step)
        for _, caption in gallery["value"]:
            p, seed, reward = caption.split(" · ")
            assert float(reward.removeprefix("reward ")) == pytest.approx(
                logged[(p, int(seed.removeprefix("seed ")))], abs=1e-3
            )
    message, update = h.export_model(jagg_id, request("visitor"))
    assert message.startswith(f"Exported run #{jagg_id} at step 1: jagg-model-run{jagg_id}-step1.zip ("), (
        message
    )
    with zipfile.ZipFile(update["value"]) as z:
        names = set(z.namelist())
    shipped = {
        f"jagg-model-run{jagg_id}-step1/{p.relative_to(export).as_posix()}"
        for p in export.rglob("*")
        if p.is_file()
    }
    assert shipped <= names

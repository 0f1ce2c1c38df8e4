"""The Try it tab and History's Export model button: a run's weights put to use, each in a worker subprocess.

* **Try it** (:meth:`TryIt.generate`): typed prompts (one a line) and seeds, the base model and a run's
  weights at one of its checkpoints side by side from the same noise, each image captioned with its reward.
  The worker is ``jagg sample RUN --step N --with-base --prompts-file FILE --seeds … --images DIR --json
  --progress`` (:func:`sample_command`) in its own session (its own process group), so the app process never
  imports torch; its ``progress:`` lines on stderr are shown while it runs, its JSON on stdout fills the two
  galleries, and a refusal (``jagg sample: error: --prompts-file: …``) comes back as one line naming the tab's
  field. What a visitor typed reaches the worker only inside that JSON file, never as a word of its command
  line: a prompt line ``--reward`` or ``--steps`` is a prompt (refused by the model's vocabulary or drawn),
  never a flag. Every other word of the command is the app's (run id, step and seeds are parsed to numbers
  first, folders are the app's own).
  A showcase run ships no checkpoint but its aligned model (:func:`app.showcase.shipped_model`): its step is
  offered too, and the worker is ``jagg sample --model DIR --with-base …``.
  Cancel (:meth:`TryIt.cancel`) kills the worker's process group; so does a page that goes away mid-run.
* **Export model** (:meth:`TryIt.export_model`): ``jagg export-model RUN --out DIR`` (:func:`export_command`;
  ``DIR`` in gradio's cache, :func:`export_work_root`, as ``--out`` may not lie in the runs folder), the folder
  zipped into the exports folder and offered as a download (a showcase run's shipped model folder is zipped as
  it is); a run without a checkpoint is refused in one line before any worker starts.

One worker at a time per app (:class:`Workers`): a second Try it or export while one runs is refused in one
line, never queued behind it. In Space mode a visitor may try (and export) any run that has a checkpoint,
the showcase's aligned model among them, within :data:`SPACE_CAPS` (prompts and seeds per try, seconds per
worker); only the session that started a worker may cancel it. The worker's files go under gradio's cache (:func:`tryit_root`), one folder per
session, the previous try's removed when the next starts.

No torch here: this module only starts and watches processes and reads their files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from app import data, showcase
from app.form import match_run
from app.runs import kill_group
from app.space import prune_exports, session_export_dir
from app.text import cannot_write, md_message
from jagg_engine import shapes_data
from jagg_engine.export_format import partial_path, remove_stale_partials
from jagg_engine.safe_yaml import brief
from jagg_engine.train.config import ConfigError

# A checkpoint is complete once its manifest is written (jagg_engine.train.checkpoint: STEP_DIR, MANIFEST).
STEP_DIR = re.compile(r"^step_(\d{5,})$")
CHECKPOINT_MANIFEST = "manifest.json"

# What one try may ask: prompts and seeds per try, seconds a worker may run (then its group is killed).
LOCAL_CAPS: dict[str, int] = {"prompts": 16, "seeds": 8, "seconds": 900}
SPACE_CAPS: dict[str, int] = {"prompts": 4, "seeds": 4, "seconds": 300}
POLL_S = 0.5  # how often a running worker's progress is read
# The worker's flags → the tab's fields, so that a refusal names what the user typed into.
FIELDS = {
    "--prompts-file": "prompts",
    "--prompt": "prompts",
    "--seeds": "seeds",
    "--step": "step",
    "RUN": "run",
    "--out": "model folder",
}


class TryItError(ValueError):
    """A try or an export that cannot start (busy, not this session's, no checkpoint); one line."""


def checkpoint_steps(run_dir: str | os.PathLike[str] | None) -> list[int]:
    """The steps of a run folder's complete checkpoints (``checkpoints/step_NNNNN/manifest.json``), in order."""
    folder = Path(run_dir) / "checkpoints" if run_dir else None
    if folder is None or not folder.is_dir():
        return []
    steps = []
    for entry in folder.iterdir():
        match = STEP_DIR.match(entry.name)
        if match and (entry / CHECKPOINT_MANIFEST).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def model_steps(run_dir: str | os.PathLike[str] | None) -> list[int]:
    """The steps Try it can use: the run folder's complete checkpoints and the step of the model it ships (a
    showcase run's, :func:`app.showcase.shipped_model`), in order."""
    steps = set(checkpoint_steps(run_dir))
    shipped = showcase.shipped_model(run_dir)
    if shipped is not None:
        steps.add(shipped[0])
    return sorted(steps)


def shipped_at(run_dir: str | os.PathLike[str] | None, step: int) -> Path | None:
    """The shipped model folder when ``step`` has no checkpoint but is the shipped model's step; else None."""
    shipped = showcase.shipped_model(run_dir)
    if shipped is None or shipped[0] != step or step in checkpoint_steps(run_dir):
        return None
    return shipped[1]


def parse_prompts(text: Any, limit: int) -> list[str]:
    """The prompts box (one prompt a line) → the prompts; ConfigError in one line naming ``prompts``."""
    if not isinstance(text, str):
        raise ConfigError(f"prompts: must be text, one prompt a line, got {brief(text)}")
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ConfigError("prompts: type at least one prompt (one a line)")
    if len(prompts) > limit:
        raise ConfigError(f"prompts: at most {limit} a try, got {len(prompts)}")
    return prompts


def check_prompt_words(run: Mapping[str, Any], shipped: Path | None, prompts: Sequence[str]) -> None:
    """A tiny-shapes run's prompts against its models' closed vocabulary (the base model's folder, the shipped
    model's), before any worker loads a model: ConfigError in one line naming ``prompts``. A folder whose
    vocabulary cannot be read here is left to the worker, which refuses in the same words."""
    config = run.get("config") or {}
    if config.get("backbone") != "tiny-shapes":
        return
    folders = [Path(config.get("model_path") or shapes_data.DEFAULT_WEIGHTS_DIR)] + (
        [shipped] if shipped else []
    )
    for folder in folders:
        vocabulary = shapes_data.model_vocabulary(folder)
        if vocabulary is not None:
            try:
                shapes_data.check_words(prompts, vocabulary)
            except ValueError as exc:
                raise ConfigError(f"prompts: {exc}") from None


def parse_seeds(text: Any, limit: int) -> list[int]:
    """The seeds box (``0, 1``) → distinct whole numbers >= 0; ConfigError in one line naming ``seeds``."""
    parts = [p.strip() for p in str(text if text is not None else "").replace(" ", ",").split(",")]
    parts = [p for p in parts if p]
    if not parts or not all(p.isdigit() and len(p) <= 9 for p in parts):
        raise ConfigError(f"seeds: must be whole numbers >= 0 like 0, 1, got {brief(text)}")
    seeds = [int(p) for p in parts]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds: must be distinct, got {brief(text)}")
    if len(seeds) > limit:
        raise ConfigError(f"seeds: at most {limit} a try, got {len(seeds)}")
    return seeds


def parse_step(value: Any, steps: Sequence[int], run_id: int) -> int:
    """The step picker's value → one of the run's checkpoint ``steps`` (empty: the last)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return steps[-1]
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not number.is_integer() or int(number) not in steps:
        have = ", ".join(str(s) for s in steps)
        raise ConfigError(f"step: run #{run_id} has checkpoints at steps {have}, got {brief(value)}")
    return int(number)


PROMPTS_FILE = "prompts.json"  # in the worker's folder: the typed prompts, a JSON list of strings


def write_prompts(folder: Path, prompts: Sequence[str]) -> Path:
    """The typed prompts as the worker reads them (``--prompts-file``): a JSON list in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PROMPTS_FILE
    path.write_text(json.dumps(list(prompts)), encoding="utf-8")
    return path


def sample_command(
    run_id: int,
    step: int,
    prompts_file: Path,
    seeds: Sequence[int],
    folder: Path,
    runs_dir: Path,
    model: Path | None = None,
) -> list[str]:
    """The Try it worker: base and run side by side, each image a PNG in ``folder``, the JSON on stdout. The
    prompts are read from ``prompts_file`` (:func:`write_prompts`), so no typed text is a word of the command.
    With ``model`` (a shipped export of the run at ``step``), the worker samples that folder instead."""
    source = ["--model", str(model)] if model is not None else [str(int(run_id)), "--step", str(int(step))]
    return [
        sys.executable, "-m", "jagg_engine.cli", "sample", *source, "--with-base",
        "--prompts-file", str(prompts_file), "--seeds", ",".join(str(int(s)) for s in seeds),
        "--out", str(folder / "grid.png"), "--images", str(folder), "--json", "--progress",
        "--runs-dir", str(runs_dir),
    ]  # fmt: skip


def export_command(run_id: int, step: int, out: Path, runs_dir: Path) -> list[str]:
    """The Export model worker: ``jagg export-model`` of one checkpoint into the new folder ``out``."""
    return [
        sys.executable, "-m", "jagg_engine.cli", "export-model", str(run_id), "--step", str(step),
        "--out", str(out), "--runs-dir", str(runs_dir),
    ]  # fmt: skip


def refusal(stderr: str, command: str) -> str:
    """A worker's one-line refusal (``jagg sample: error: --prompt: …``) with the flag named as the tab's
    field; else the last line it wrote."""
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("progress: ")]
    if not lines:
        return ""
    line = lines[-1].strip()
    prefix = f"jagg {command}: error: "
    if line.startswith(prefix):
        line = line[len(prefix) :]
        for flag, name in FIELDS.items():
            if line.startswith(f"{flag}: "):
                return f"{name}: {line[len(flag) + 2 :]}"
    return line


def export_work_root() -> Path:
    """Where the Export model worker writes the model folder before it is zipped: inside gradio's cache, outside
    the runs folder (``jagg export-model`` refuses an ``--out`` inside it); a folder an app killed mid-export
    left there is removed at the next export (:func:`jagg_engine.export_format.remove_stale_partials`)."""
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder()) / "jagg-export-work"


def tryit_root() -> Path:
    """Where the workers' images go: inside gradio's cache, which serves them without another copy."""
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder()) / "jagg-tryit"


def _session_folder(session: str | None) -> Path:
    # named by a hash: the session hash comes from the client and is never used as a path
    return tryit_root() / hashlib.sha256((session or "").encode()).hexdigest()[:32]


@dataclass
class Worker:
    """One running worker: its process (session leader), what it does, for whom, and its files."""

    proc: subprocess.Popen
    kind: str  # "try" or "export"
    session: str | None
    folder: Path
    started: float = field(default_factory=time.monotonic)
    cancelled: bool = False

    def stderr(self) -> str:
        return _read(self.folder / "stderr.log")

    def stdout(self) -> str:
        return _read(self.folder / "stdout.log")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


class Workers:
    """At most one worker at a time for the whole app (a Space's CPU trains too); thread-safe."""

    def __init__(self, env: Mapping[str, str] | None = None):
        self.env = dict(env) if env is not None else None
        self._worker: Worker | None = None
        self._lock = threading.Lock()

    def start(self, argv: list[str], kind: str, session: str | None, folder: Path) -> Worker:
        """Start ``argv`` in its own session, stdout and stderr to files of ``folder``; TryItError when a
        worker still runs."""
        with self._lock:
            busy = self._worker
            if busy is not None and busy.proc.poll() is None:
                what = "a Try it" if busy.kind == "try" else "a model export"
                ago = time.monotonic() - busy.started
                raise TryItError(
                    f"{what} is running (started {ago:.0f} s ago); one at a time, try again soon"
                )
            folder.mkdir(parents=True, exist_ok=True)
            with (folder / "stdout.log").open("wb") as out, (folder / "stderr.log").open("wb") as err:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own process group: Cancel kills the worker and its children
                    env=self.env,
                )
            self._worker = Worker(proc, kind, session, folder)
            return self._worker

    def current(self) -> Worker | None:
        with self._lock:
            return self._worker

    def cancel(self, session: str | None, space: bool) -> str:
        """Kill the running worker's process group (in Space mode only the session that started it may)."""
        with self._lock:
            worker = self._worker
            if worker is None or worker.proc.poll() is not None:
                return "Nothing to cancel: no Try it or model export is running."
            if space and worker.session != session:
                raise TryItError("another visitor's worker is running; only they can cancel it")
            worker.cancelled = True
        stop(worker)
        return "Cancelled."


def stop(worker: Worker) -> None:
    """SIGTERM, then SIGKILL, the worker's process group, and reap it."""
    kill_group(worker.proc.pid, grace=2.0)
    try:
        worker.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def wait(worker: Worker, seconds: float, on_poll: Callable[[Worker], None] | None = None) -> bool:
    """Wait for the worker to end (``on_poll`` between looks); past ``seconds`` its group is killed. Returns
    whether it ended by itself."""
    while worker.proc.poll() is None:
        if time.monotonic() - worker.started > seconds:
            stop(worker)
            return False
        if on_poll is not None:
            on_poll(worker)
        time.sleep(POLL_S)
    return True


class TryIt:
    """The Try it tab's and the Export model button's handlers over the app's :class:`app.handlers.Handlers`
    (its store, runs folder, Space mode, guard and file publisher)."""

    def __init__(self, app: Any, workers: Workers | None = None):
        self.app, self.store, self.root, self.space = app, app.store, app.root, app.space
        self.caps = SPACE_CAPS if self.space else LOCAL_CAPS
        self.workers = workers or Workers()

    # ------------------------------------------------------------------ pickers
    def runs(self) -> list[dict[str, Any]]:
        """Runs with a complete checkpoint (or a shipped model), newest first, the showcase's after the user's
        own (the picker's list; it opens on :meth:`default_run`)."""
        shipped = set(getattr(self.app, "showcase_ids", None) or [])
        found = [r for r in self.store.list_runs() if model_steps(r.get("run_dir"))]
        return sorted(found, key=lambda r: r["id"] in shipped)

    def run_choices(self) -> list[tuple[str, int]]:
        return [(data.run_label(r), r["id"]) for r in self.runs()]

    @staticmethod
    def opening_run(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The run the picker opens on, of ``runs`` (runs with a model): a finished run before any other, then
        the one trained the most steps (its last checkpoint's or shipped model's step), then the newest. A
        one-step test run does not hide the showcase's 40-step model, and a run of the user's that trained
        longer comes before it."""
        if not runs:
            return None
        return max(
            runs,
            key=lambda r: (
                r.get("status") == "finished",
                (model_steps(r.get("run_dir")) or [0])[-1],
                r["id"],
            ),
        )

    def default_run(self) -> int | None:
        run = self.opening_run(self.runs())
        return run["id"] if run else None

    def initial(self) -> tuple[list[tuple[str, int]], int | None, list[int]]:
        """The pickers as the page opens: the choices, the run it opens on (:meth:`opening_run`) and its
        steps."""
        runs = self.runs()
        run = self.opening_run(runs)
        steps = model_steps(run.get("run_dir")) if run else []
        return [(data.run_label(r), r["id"]) for r in runs], (run["id"] if run else None), steps

    def load_pickers(self) -> tuple[Any, Any]:
        """At each page load: the run picker (runs with a checkpoint now, on :meth:`opening_run`) and its
        steps."""
        choices, value, steps = self.initial()
        return (
            gr.update(choices=choices, value=value),
            gr.update(choices=steps, value=steps[-1] if steps else None),
        )

    def pick_run(self) -> Any:
        """The run picker's choices now (on focus: runs that gained a checkpoint since the page opened)."""
        return gr.update(choices=self.run_choices())

    def steps_of(self, run_id: Any) -> Any:
        """The step picker for the picked run: its checkpoint steps, on the last."""
        try:
            number = match_run(run_id, self.store.list_runs(), "run")
        except ConfigError:
            return gr.update(choices=[], value=None)
        run = self.store.get_run(number) if number is not None else None
        steps = model_steps(run.get("run_dir")) if run else []
        return gr.update(choices=steps, value=steps[-1] if steps else None)

    def refresh_steps(self, run_id: Any, step: Any) -> Any:
        """On focus of the step picker: the run's checkpoint steps now, the picked one kept while it has one."""
        update = self.steps_of(run_id)
        if step in update["choices"]:
            update["value"] = step
        return update

    def _checked_run(self, run_id: Any, field: str) -> tuple[int, list[int], Any]:
        number = match_run(run_id, self.store.list_runs(), field)
        if number is None:
            raise ConfigError(f"{field}: pick a run with a checkpoint")
        run = self.store.get_run(number)
        if run is None:
            raise ConfigError(f"{field}: no run #{number}")
        steps = model_steps(run.get("run_dir"))
        if not steps:
            raise TryItError(
                f"run #{number} has no checkpoint (a run has one once it ends or at every checkpoint_every "
                "steps)"
            )
        return number, steps, run.get("run_dir")

    # ------------------------------------------------------------------ Try it
    def generate(
        self, run_id: Any, step: Any, prompts: Any, seeds: Any, request: gr.Request = None
    ) -> Iterator[tuple[str, Any, Any]]:  # type: ignore[assignment]
        """(message, base gallery, run gallery): progress lines while the worker runs, then both galleries,
        each image captioned with its prompt, seed and reward."""
        sess = getattr(request, "session_hash", None) or None
        try:
            number, steps, run_dir = self._checked_run(run_id, "run")
            at = parse_step(step, steps, number)
            typed = parse_prompts(prompts, self.caps["prompts"])
            chosen = parse_seeds(seeds, self.caps["seeds"])
            shipped = shipped_at(run_dir, at)
            check_prompt_words(self.store.get_run(number) or {}, shipped, typed)  # before any model loads
            folder = _session_folder(sess)
            shutil.rmtree(folder, ignore_errors=True)  # the session's previous try
            prompts_file = write_prompts(folder, typed)
            argv = sample_command(number, at, prompts_file, chosen, folder, self.root, shipped)
            worker = self.workers.start(argv, "try", sess, folder)
        except (ConfigError, TryItError) as exc:
            yield f"**Not started.** {md_message(exc)}", gr.skip(), gr.skip()
            return
        except OSError as exc:
            why = md_message(exc.strerror or exc)
            yield f"**Error:** cannot start the worker: {why}", gr.skip(), gr.skip()
            return
        empty: list[Any] = []
        yield f"Starting: base and run #{number} at step {at}…", empty, empty
        try:
            while worker.proc.poll() is None:
                elapsed = time.monotonic() - worker.started
                if elapsed > self.caps["seconds"]:
                    stop(worker)
                    limit = self.caps["seconds"]
                    yield f"**Error:** stopped after {limit} s (the limit of one try).", empty, empty
                    return
                phases = [ln for ln in worker.stderr().splitlines() if ln.startswith("progress: ")]
                phase = phases[-1].removeprefix("progress: ") if phases else "starting the worker"
                yield f"Working ({elapsed:.0f} s): {md_message(phase)}…", gr.skip(), gr.skip()
                time.sleep(POLL_S)
        finally:  # the page went away (the generator is closed) or an error: the worker goes too
            if worker.proc.poll() is None:
                stop(worker)
        if worker.cancelled:
            yield "Cancelled: the worker was stopped.", empty, empty
            return
        if worker.proc.returncode != 0:
            why = (
                refusal(worker.stderr(), "sample") or f"the worker exited with code {worker.proc.returncode}"
            )
            yield f"**Error:** {md_message(why)}", empty, empty
            return
        try:
            summary = json.loads(worker.stdout().strip().splitlines()[-1])
            base, trained = summary["models"]
        except (ValueError, IndexError, KeyError, TypeError):
            yield "**Error:** the worker's output did not read as its JSON summary.", empty, empty
            return
        # the images lie in gradio's cache (tryit_root), which serves them as they are
        galleries = [
            [(i["path"], f"{i['prompt']} · seed {i['seed']} · reward {i['reward']:.3f}") for i in m["images"]]
            for m in (base, trained)
        ]
        message = (
            f"Same prompts and noise: base (mean reward {base['reward_mean']:.3f}) and run #{number} at step "
            f"{at} (mean reward {trained['reward_mean']:.3f}), {len(typed)} prompt(s) × {len(chosen)} seed(s)."
        )
        yield message, *(gr.update(value=g, columns=max(2, len(chosen))) for g in galleries)

    def cancel(self, request: gr.Request = None) -> str:  # type: ignore[assignment]
        """Kill the running worker (Try it or export); in Space mode only the visitor who started it may."""
        try:
            return self.workers.cancel(getattr(request, "session_hash", None) or None, self.space)
        except TryItError as exc:
            return f"**Refused.** {md_message(exc)}"

    # ------------------------------------------------------------------ Export model
    def export_model(self, run_id: Any, request: gr.Request = None) -> tuple[str, Any]:  # type: ignore[assignment]
        """``jagg export-model`` of the run's last checkpoint, zipped: (message, the download's update)."""
        hidden = gr.update(value=None, visible=False)
        sess = getattr(request, "session_hash", None) or None
        out_dir = session_export_dir(sess) if self.space else self.root / "exports"
        try:
            number, steps, run_dir = self._checked_run(run_id, "run id")
            name = f"jagg-model-run{number}-step{steps[-1]}"
            shipped = shipped_at(run_dir, steps[-1])
            out_dir.mkdir(parents=True, exist_ok=True)
            root = export_work_root()
            root.mkdir(parents=True, exist_ok=True)
            for folder in (root, out_dir):  # what an app killed mid-export (kill -9) left
                remove_stale_partials(folder)
            work = partial_path(root, f"{name}-{secrets.token_hex(4)}")
            work.mkdir()
        except (ConfigError, TryItError) as exc:
            return f"**Not exported.** {md_message(exc)}", hidden
        except OSError as exc:
            return cannot_write(out_dir, exc), hidden
        if shipped is not None:  # the showcase's model: already the folder export-model writes
            try:
                shutil.copytree(shipped, work / name)
                final = self._zip(work, name, out_dir)
            except OSError as exc:
                return cannot_write(out_dir, exc), hidden
            finally:
                shutil.rmtree(work, ignore_errors=True)
            return self._exported(number, steps[-1], final, out_dir)
        try:
            worker = self.workers.start(
                export_command(number, steps[-1], work / name, self.root), "export", sess, work
            )
        except TryItError as exc:
            shutil.rmtree(work, ignore_errors=True)
            return f"**Not exported.** {md_message(exc)}", hidden
        try:
            if not wait(worker, self.caps["seconds"]) and not worker.cancelled:
                return f"**Error:** the export stopped after {self.caps['seconds']} s.", hidden
            if worker.cancelled:
                return "Cancelled: the export was stopped.", hidden
            if worker.proc.returncode != 0:
                why = refusal(worker.stderr(), "export-model") or f"exit code {worker.proc.returncode}"
                return f"**Not exported.** {md_message(why)}", hidden
            final = self._zip(work, name, out_dir)
        except OSError as exc:
            return cannot_write(out_dir, exc), hidden
        finally:
            if worker.proc.poll() is None:
                stop(worker)
            shutil.rmtree(work, ignore_errors=True)
        return self._exported(number, steps[-1], final, out_dir)

    @staticmethod
    def _zip(work: Path, name: str, out_dir: Path) -> Path:
        """``work/name`` zipped into a partial file of ``out_dir``, renamed ``name.zip`` when whole; its path."""
        partial = partial_path(out_dir, f"{name}-{secrets.token_hex(4)}")
        try:
            archive = Path(shutil.make_archive(str(partial), "zip", root_dir=work, base_dir=name))
            final = out_dir / f"{name}.zip"
            os.replace(archive, final)
        except BaseException:
            Path(f"{partial}.zip").unlink(missing_ok=True)
            raise
        return final

    def _exported(self, number: int, step: int, final: Path, out_dir: Path) -> tuple[str, Any]:
        if self.space:
            prune_exports(out_dir.parent, keep=[final])
        size = final.stat().st_size / 1024**2
        message = (
            f"Exported run #{number} at step {step}: {final.name} ({size:.1f} MB), the model folder of "
            "`jagg export-model` with its model card."
        )
        return message, gr.update(value=self.app.publish(final), visible=True)


def wire(tab: Any, history: Any, h: TryIt) -> None:
    """Connect the Try it tab (:func:`app.layout.tryit_tab`) and History's Export model button to ``h``."""
    tab.run.change(h.steps_of, tab.run, tab.step, api_name="try_it_steps")
    tab.run.focus(h.pick_run, None, tab.run, api_visibility="private")
    tab.step.focus(h.refresh_steps, [tab.run, tab.step], tab.step, api_visibility="private")
    # no triggers: at each page load (the pickers as built are the app's start's)
    gr.on(None, h.load_pickers, None, [tab.run, tab.step], api_visibility="private")
    tab.generate_btn.click(
        h.generate, [tab.run, tab.step, tab.prompts, tab.seeds], [tab.message, tab.base, tab.trained],
        api_name="try_it", concurrency_limit=None,  # one worker at a time is Workers' rule, refused in one line
        show_progress="minimal",
    )  # fmt: skip
    tab.cancel_btn.click(h.cancel, None, tab.message, api_name="try_it_cancel", concurrency_limit=None)
    history.model_btn.click(
        h.export_model, history.target, [history.history_msg, history.model_file], api_name="export_model",
        concurrency_limit=None,
    )  # fmt: skip

"""The Gradio app: new run, live view, compare, history. ``build_app(runs_dir) -> gr.Blocks``.

Only wiring lives here: reading the form into a :class:`TrainConfig` (validated by the config module,
errors shown inline), calling :class:`app.runs.RunManager` for lifecycle, and :mod:`app.data` for every
table and figure. Nothing is built at import time. Every event has an ``api_name`` so gradio_client (and
scripts) can drive the app the same way the browser does.

Space mode (a Hugging Face Space: ``SPACE_ID`` is set) holds visitors to :mod:`app.space`'s policy: capped
runs of tiny-shapes, no paths, queue limits, only their own runs to cancel, resume or delete, an owner login.
The app opens on the Compare tab showing the shipped showcase (:mod:`app.showcase`), read-only.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from app import data, showcase
from app.runs import CommandFactory, RunManager, train_command, train_resume_command
from app.space import (
    CAPS,
    OWNER_PASSWORD_ENV,
    SPACE_BACKBONES,
    FilePublisher,
    SpaceError,
    SpaceGuard,
    SpaceLimits,
    check_space_config,
    session_export_dir,
    space_mode_from_env,
)
from jagg_engine.backbones import BACKBONES
from jagg_engine.store import DB_NAME, StoreError
from jagg_engine.train.config import ALGORITHMS, STRATEGIES, ConfigError, TrainConfig

BACKBONE_CHOICES = tuple(name for name, spec in BACKBONES.items() if spec.in_app)  # the registry's app flag
TICK_S = 2.0
# The New run form's inputs, in the order of form_config's parameters (the API's parameter names).
FORM_FIELDS = ("name", "backbone", "model_path", "rewards", "algorithm", "window", "jagg_frac", "strategy", "steps",
               "group_size", "lr", "seed", "processes", "overrides")  # fmt: skip
__all__ = ["build_app", "form_config", "space_mode_from_env", "speedup_note"]


def has_gpu() -> bool:
    """An NVIDIA driver is present (decides the default r without initialising CUDA in the app)."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


# ---------------------------------------------------------------------------------------------- form → config


def parse_rewards(text: str) -> dict[str, float]:
    """``"shapes-dense: 1.0, pickscore: 0.5"`` (commas or new lines; a bare name weighs 1) → dict."""
    rewards: dict[str, float] = {}
    for item in text.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, weight = item.partition(":")
        if not sep:
            name, sep, weight = item.partition("=")
        try:
            rewards[name.strip()] = float(weight) if sep else 1.0
        except ValueError:
            raise ConfigError(
                f"rewards: weight of {name.strip()!r} must be a number, got {weight.strip()!r}"
            ) from None
    return rewards


RUN_ID_MAX = 2**63 - 1  # SQLite's INTEGER


def parse_run_id(value: Any, field: str = "run id") -> int | None:
    """A handler's run id (an int from a dropdown, a float from a number box, a string from a custom value or
    the API) → int, or None when empty. Anything else raises ConfigError naming ``field``: a fraction, NaN,
    a bool, a non-numeric string, a value outside 1..2^63 − 1."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    number: Any = value
    if isinstance(value, str):
        text = value.strip()
        number = int(text) if text.lstrip("+-").isdigit() else None
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= RUN_ID_MAX:
        raise ConfigError(f"{field}: must be a whole number from 1 to {RUN_ID_MAX}, got {value!r}")
    return number


def parse_ratio(value: Any, default: float) -> float:
    """The cost ratio r of the form (empty = ``default``); must be a finite number > 0."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    try:
        r = float(value)
    except (TypeError, ValueError):
        r = math.nan
    if isinstance(value, bool) or not (math.isfinite(r) and r > 0):
        raise ConfigError(f"r: must be a finite number > 0, got {value!r}")
    return r


def parse_overrides(text: str) -> list[str]:
    """One ``key=value`` a line (or separated by spaces when no value holds a space)."""
    items = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        items += line.split() if "=" in line and line.count("=") == len(line.split()) else [line]
    return items


def form_config(
    runs_dir: str | os.PathLike[str],
    name: str,
    backbone: str,
    model_path: str,
    rewards: str,
    algorithm: str,
    window: float,
    jagg_frac: float,
    strategy: str,
    steps: float,
    group_size: float,
    lr: float,
    seed: float,
    processes: float,
    overrides: str,
    space_mode: bool = False,
) -> TrainConfig:
    """The form's values → a validated TrainConfig; raises ConfigError with the one-line message. With
    ``space_mode`` the result must also pass :func:`app.space.check_space_config` (caps, no paths)."""
    for key, text in (
        ("name", name),
        ("model_path", model_path),
        ("rewards", rewards),
        ("overrides", overrides),
    ):
        if text is not None and not isinstance(text, str):
            raise ConfigError(f"{key}: must be text, got {text!r}")
    values: dict[str, Any] = {
        "name": (name or "").strip() or backbone,
        "backbone": backbone,
        "model_path": (model_path or "").strip() or None,
        "rewards": parse_rewards(rewards or ""),
        "algorithm": algorithm,
        "window": window,
        "jagg_frac": jagg_frac,
        "strategy": strategy,
        "steps": steps,
        "group_size": group_size,
        "lr": lr,
        "seed": seed,
        "processes": processes,
    }
    for key, value in values.items():
        if value is None and key not in ("model_path",):
            raise ConfigError(f"{key}: must not be empty")
    extra = parse_overrides(overrides)
    cfg = TrainConfig.from_dict(values).apply_overrides(extra)
    if space_mode:  # every field, form or override, before the app sets its own output_dir
        check_space_config(cfg)
    cfg = TrainConfig.from_dict({**cfg.to_dict(), "output_dir": str(Path(runs_dir).resolve())})
    return cfg.validate(check_environment=True)


def speedup_note(
    window: float | None,
    jagg_frac: float | None,
    strategy: str,
    r: float | None,
    reuse: bool = False,
    updates_per_rollout: int = 1,
) -> str:
    """The cost-model line shown under the form before launch (``reuse``: reuse_rollout_velocity is auto)."""
    try:
        w, f, r_ = int(window), float(jagg_frac), float(r)
        if w < 2 or not 0 <= f <= 1 or r_ <= 0:
            raise ValueError
    except (TypeError, ValueError):
        return "Predicted update-phase speedup: needs W ≥ 2, jagg_frac in [0, 1] and r > 0."
    kind = "jagg" if strategy != "exact" else "exact"
    reuse = reuse and strategy == "jagg"  # only JAGG's inner steps take the rollout's velocities
    s = data.predicted_speedup(w, r_, f, kind, reuse=reuse, updates_per_rollout=updates_per_rollout)
    if strategy == "exact":
        return f"Predicted update-phase speedup: **1.00×** (strategy exact is the baseline; W·r = {w * r_:.1f} units per window)."
    if reuse:
        on = (
            "every update" if updates_per_rollout == 1 else f"the first of {updates_per_rollout} mini-batches"
        )
        per_group = f"jagg with the rollout's velocities {2 * r_:.1f} on {on}, else {w - 2 + 2 * r_:.1f}"
    else:
        per_group = f"{strategy} {w - 2 + 2 * r_:.1f}"
    return (
        f"Predicted update-phase speedup over exact: **{s:.2f}×** (cost model, W = {w}, jagg_frac = {f:g}, "
        f"r = {r_:g}: exact {w * r_:.1f} units per window, {per_group})."
    )


# ---------------------------------------------------------------------------------------------- the app


def build_app(
    runs_dir: str | os.PathLike[str],
    space_mode: bool | None = None,
    *,
    command: CommandFactory = train_command,
    resume_command: CommandFactory = train_resume_command,
    max_concurrent: int = 1,
    cancel_timeout: float = 60.0,
    r_default: float | None = None,
    background_ticks: bool = True,
    owner_password: str | None = None,
    limits: SpaceLimits | None = None,
    showcase_dir: str | os.PathLike[str] | None = showcase.SHOWCASE_DIR,
) -> gr.Blocks:
    """Build the Blocks of the app over ``runs_dir`` (created if missing; its jagg.db holds the history).

    On build, runs left from an earlier app process are re-attached: dead ones are marked failed and queued
    ones start. ``background_ticks`` also runs the queue every TICK_S seconds without a browser open (the
    page's timer does the same while one is). ``demo.jagg_manager`` is the RunManager,
    ``demo.jagg_runs_dir`` the resolved folder (never an allowed path of gradio's file route: images and
    exports reach it as copies in gradio's cache), ``demo.jagg_guard`` the :class:`SpaceGuard`.

    ``showcase_dir`` (None: none) is loaded into the history once and shown read-only on the Compare tab the
    page opens on. ``owner_password`` (default: the JAGG_OWNER_PASSWORD environment variable) and ``limits``
    (default: from the environment) apply in space mode.
    """
    space = space_mode_from_env() if space_mode is None else space_mode
    root = Path(runs_dir).resolve()
    manager = RunManager(
        root,
        command=command,
        max_concurrent=max_concurrent,
        cancel_timeout=cancel_timeout,
        resume_command=resume_command,
    )
    manager.tick()
    showcase_ids = showcase.install(manager.store, root, showcase_dir) if showcase_dir is not None else []
    guard = SpaceGuard(
        root,
        space,
        owner_password if owner_password is not None else os.environ.get(OWNER_PASSWORD_ENV),
        limits or SpaceLimits.from_env(),
        read_only=showcase_ids,
    )
    publish = FilePublisher(root)
    # The queue pass and the timer's reads, once per tick for all open tabs (queue_tick is defined below).
    shared = data.SharedTick(manager.store, lambda: queue_tick(), max_age=TICK_S / 2)
    r0 = r_default if r_default is not None else data.default_r(has_gpu())
    defaults = TrainConfig()
    reuse_defaults = (defaults.reuse_rollout_velocity == "auto", defaults.updates_per_rollout)
    backbones = SPACE_BACKBONES if space else BACKBONE_CHOICES
    max_steps = CAPS["steps"] if space else None

    # ------------------------------------------------------------------ handlers (plain functions)
    def run_choices() -> list[tuple[str, int]]:
        return [(data.run_label(r), r["id"]) for r in manager.store.list_runs()]

    def default_run() -> int | None:
        runs = manager.store.list_runs()
        live = [r for r in runs if r["status"] in ("running", "queued")]
        return (live[-1] if live else runs[0])["id"] if runs else None

    def waiting() -> list[dict[str, Any]]:
        resuming = set(manager.resuming())
        return [
            r
            for r in manager.store.list_runs()
            if r["status"] in ("queued", "running") or r["id"] in resuming
        ]

    def checked_config(form: tuple[Any, ...], session: str | None, new_runs: int) -> TrainConfig:
        cfg = form_config(root, *form, space_mode=space and not guard.is_owner(session))
        if space:
            guard.check_queue(session, waiting(), new_runs)
        return cfg

    def queue_tick() -> list[int]:
        started = manager.tick()
        guard.prune(manager.store)
        return started

    def launch(*form: Any, request: gr.Request | None = None) -> tuple[str, int | None, Any]:
        session = _session(request)
        try:
            cfg = checked_config(form, session, 1)
            run_id = manager.create(cfg.to_dict())
        except (ConfigError, SpaceError, StoreError) as exc:
            return f"**Not launched.** {exc}", None, gr.skip()
        guard.record(session, [run_id])
        started = queue_tick()
        where = "started" if run_id in started else "queued (starts when the current run finishes)"
        return f"Run #{run_id} {where}.", run_id, gr.update(choices=run_choices(), value=run_id)

    def launch_pair(*form: Any, request: gr.Request | None = None) -> tuple[str, int | None, Any]:
        session = _session(request)
        try:
            cfg = checked_config(form, session, 2)
            exact_id, jagg_id = manager.create_pair(cfg.to_dict())
        except (ConfigError, SpaceError, StoreError) as exc:
            return f"**Not launched.** {exc}", None, gr.skip()
        guard.record(session, [exact_id, jagg_id])
        queue_tick()
        return (
            f"Pair queued: exact #{exact_id}, then JAGG #{jagg_id} (same config, prompts and seeds; the second "
            f"starts when the first finishes).",
            jagg_id,
            gr.update(choices=run_choices(), value=exact_id),
        )

    def predict(window: float, jagg_frac: float, strategy: str, r: float) -> str:
        return speedup_note(window, jagg_frac, strategy, r, *reuse_defaults)

    def live_view(run_id: int | None, r: float) -> tuple[Any, ...]:
        try:
            number, ratio = parse_run_id(run_id), parse_ratio(r, r0)
        except ConfigError as exc:
            empty = data._empty("Reward", "pick a run")
            return (f"**Error:** {exc}", empty, empty, pd.DataFrame(), empty, empty, [], "")
        run = manager.store.get_run(number) if number is not None else None
        if run is None:
            empty = data._empty("Reward", "pick a run")
            note = "No run selected." if number is None else f"No run #{number}."
            return (note, empty, empty, pd.DataFrame(), empty, empty, [], "")
        frame = manager.store.metrics_frame(run["id"])
        log = data.log_tail(run["run_dir"], stdout=run["status"] == "failed")
        if run["status"] == "failed" and run.get("error") and not log:
            log = run["error"]
        return (
            data.progress_markdown(run),
            data.reward_figure({"": frame}, title=f"Reward — run #{run['id']}"),
            data.time_breakdown_figure(frame),
            data.speedup_frame(manager.store, run["id"], ratio),
            data.pass_counts_figure(frame),
            data.probe_figure(
                manager.store.probes(run["id"]),
                route_frac=frame["route/jagg_frac"].dropna().iloc[-1]
                if "route/jagg_frac" in frame and frame["route/jagg_frac"].notna().any()
                else None,
                threshold=run["config"].get("auto_route_threshold")
                if run["config"].get("auto_route")
                else None,
            ),
            publish.items(data.gallery_items(manager.store, run["id"], root)),
            log,
        )

    def on_tick(run_id: int | None, r: float, seen: Any, list_seen: Any) -> tuple[Any, ...]:
        # Every open tab's timer lands here; `shared` does the queue pass and the reads once per tick.
        shared.tick()
        try:
            sig = shared.signature(parse_run_id(run_id))
        except ConfigError:
            sig = ("invalid", repr(run_id))  # live_view shows the one-line error once
        runs = shared.runs()
        runs_sig = tuple((x["id"], x["status"]) for x in runs)
        choices_update = (
            gr.update(choices=[(data.run_label(x), x["id"]) for x in runs])
            if list(runs_sig) != list(list_seen or [])
            else gr.skip()
        )
        if list(sig) == list(seen or []):
            return (*(gr.skip() for _ in range(8)), seen, choices_update, runs_sig)
        return (*live_view(run_id, r), sig, choices_update, runs_sig)

    def on_load(r: float) -> tuple[Any, ...]:
        run_id = default_run()
        return (gr.update(choices=run_choices(), value=run_id), *live_view(run_id, r))

    def run_action(run_id: float | None, request: gr.Request | None, action: str, empty: str) -> str:
        """Cancel or resume ``run_id`` once the id parses and Space mode allows this session the action."""
        try:
            number = parse_run_id(run_id)
            if number is None:
                return empty
            guard.check_action(_session(request), number, action)
            return getattr(manager, action)(number)
        except SpaceError as exc:
            return f"**Refused.** {exc}"
        except (ConfigError, StoreError) as exc:
            return f"**Error:** {exc}"

    def cancel(run_id: int | None, request: gr.Request | None = None) -> str:
        return run_action(run_id, request, "cancel", "No run selected.")

    def resume(run_id: float | None, request: gr.Request | None = None) -> str:
        return run_action(run_id, request, "resume", "Enter a run id.")

    def compare(run_ids: list[int] | None, r: float) -> tuple[Any, ...]:
        try:
            if run_ids is not None and not isinstance(run_ids, (list, tuple)):
                raise ConfigError(f"runs: must be a list of run ids, got {run_ids!r}")
            ids = [i for i in (parse_run_id(v, "runs") for v in run_ids or []) if i is not None]
            ratio = parse_ratio(r, r0)
        except ConfigError as exc:
            return data._empty("Reward", str(exc)), pd.DataFrame(), pd.DataFrame(), []
        runs = [run for run in (manager.store.get_run(i) for i in ids) if run is not None]
        if len(runs) < 2:
            empty = data._empty("Reward", "pick two or more runs")
            return empty, pd.DataFrame(), pd.DataFrame(), []
        frames = {
            f"#{run['id']} {run['config'].get('strategy')}": manager.store.metrics_frame(run["id"])
            for run in runs
        }
        configs = {f"#{run['id']}": run["config"] for run in runs}
        return (
            data.reward_figure(frames, title="Reward"),
            data.compare_frame(manager.store, ids, ratio),
            data.config_diff(configs),
            publish.items(data.side_by_side_first_last(manager.store, ids, root)),
        )

    def history() -> pd.DataFrame:
        return data.history_frame(manager.store)

    def delete(
        run_id: float | None, delete_files: bool, request: gr.Request | None = None
    ) -> tuple[str, pd.DataFrame]:
        try:
            number = parse_run_id(run_id)
            if number is None:
                return "Enter a run id.", history()
            if not isinstance(delete_files, bool) and delete_files is not None:
                raise ConfigError(f"also delete its folder: must be true or false, got {delete_files!r}")
            guard.check_action(_session(request), number, "delete")
            removed = manager.store.delete_run(number, delete_files=bool(delete_files))
        except SpaceError as exc:
            return f"**Refused.** {exc}", history()
        except (ConfigError, StoreError) as exc:
            return f"**Error:** {exc}", history()
        guard.forget(number)
        return f"Run #{number} deleted{' with its folder' if removed else ''}.", history()

    def export(run_id: float | None, request: gr.Request | None = None) -> tuple[str, list[str] | None]:
        # A visitor's exports go to a folder of their own session, never into the runs folder.
        out_dir = session_export_dir(_session(request)) if space else root / "exports"
        try:
            number = parse_run_id(run_id)
            if number is None:
                return "Enter a run id.", None
            csv_path, json_path = manager.store.export_run(number, out_dir)
        except (ConfigError, StoreError) as exc:
            return f"**Error:** {exc}", None
        except OSError as exc:  # a read-only or full folder
            return f"**Error:** cannot write {out_dir}: {exc.strerror or exc}", None
        return f"Exported run #{number}.", [publish(csv_path), publish(json_path)]

    def login(password: str, request: gr.Request | None = None) -> str:
        return guard.login(_session(request), password)

    def owner_file(rel_path: str, request: gr.Request | None = None) -> tuple[str, str | None]:
        """A file of the runs folder (jagg.db, a checkpoint, a log), for the owner only."""
        try:
            guard.check_owner(_session(request), "download")
            path = (root / (rel_path or "").strip()).resolve()
            if not path.is_relative_to(root) or not path.is_file():
                raise StoreError(f"download: no file {rel_path!r} in the runs folder")
        except (SpaceError, StoreError) as exc:
            return f"**Refused.** {exc}", None
        if path.name == DB_NAME:  # a consistent copy of a live database (WAL): SQLite's backup
            copy = Path(tempfile.mkdtemp(prefix="jagg-owner-")) / DB_NAME
            with closing(sqlite3.connect(path)) as src, closing(sqlite3.connect(copy)) as dst:
                src.backup(dst)
            return f"{rel_path}: {copy.stat().st_size:,} bytes.", str(copy)
        return f"{rel_path}: {path.stat().st_size:,} bytes.", publish(path)

    # ------------------------------------------------------------------ layout
    with gr.Blocks(title="JAGG Studio") as demo:
        gr.Markdown(
            "# JAGG Studio\nGRPO for flow-matching image transformers, with JAGG: two endpoint backward passes "
            "per window of W denoising steps instead of W."
            + (
                f"\n\n*Space mode: tiny-shapes only, at most {CAPS['steps']} steps, one run trains at a time and "
                f"{guard.limits.per_visitor} may wait or train per visitor. You can cancel, resume and delete the "
                "runs you started.*"
                if space
                else ""
            )
        )
        run_seen = gr.State(None)
        list_seen = gr.State(None)
        shown = compare(showcase_ids, r0) if len(showcase_ids) >= 2 else None  # the page opens on this
        with gr.Tabs(selected="compare" if shown else "new"):
            with gr.Tab("New run", id="new"):
                with gr.Row():
                    name = gr.Textbox(label="name", value=defaults.name, scale=2)
                    backbone = gr.Dropdown(list(backbones), value="tiny-shapes", label="backbone")
                    model_path = gr.Textbox(
                        label="model path (local folder or hub id; empty = the backbone's default)",
                        visible=not space,
                        scale=2,
                    )
                with gr.Row():
                    rewards = gr.Textbox(
                        label="rewards (name: weight, …)",
                        value=", ".join(f"{k}: {v:g}" for k, v in defaults.rewards.items()),
                        info="shapes, shapes-dense, brightness, colorfulness, jpeg_compressibility, "
                        "jpeg_incompressibility, pickscore, clipscore, hpsv2",
                        scale=2,
                    )
                    algorithm = gr.Dropdown(list(ALGORITHMS), value=defaults.algorithm, label="algorithm")
                    strategy = gr.Dropdown(list(STRATEGIES), value=defaults.strategy, label="strategy")
                with gr.Row():
                    window = gr.Number(value=defaults.window, precision=0, label="W (window)")
                    jagg_frac = gr.Slider(0.0, 1.0, value=defaults.jagg_frac, step=0.05, label="jagg_frac")
                    steps = gr.Number(
                        value=min(defaults.steps, max_steps or defaults.steps), precision=0, label="steps"
                    )
                    group_size = gr.Number(value=defaults.group_size, precision=0, label="group size")
                with gr.Row():
                    lr = gr.Number(value=defaults.lr, label="lr")
                    seed = gr.Number(value=defaults.seed, precision=0, label="seed")
                    processes = gr.Number(value=1, precision=0, label="processes", interactive=not space)
                    r_input = gr.Number(value=r0, label="r = cost of forward+backward / forward")
                overrides = gr.Textbox(
                    label="more settings (key=value, one a line)",
                    placeholder="sampling_steps=6\nprompts_per_step=2\neval_every=5",
                    lines=3,
                )
                prediction = gr.Markdown(
                    speedup_note(defaults.window, defaults.jagg_frac, defaults.strategy, r0, *reuse_defaults)
                )
                with gr.Row():
                    launch_btn = gr.Button("Launch", variant="primary")
                    pair_btn = gr.Button("Compare exact vs JAGG")
                launch_msg = gr.Markdown()
                launched_id = gr.Number(label="launched run id", precision=0, interactive=False)

            with gr.Tab("Live", id="live"):
                with gr.Row():
                    live_run = gr.Dropdown(
                        choices=run_choices(),
                        value=default_run(),
                        label="run",
                        scale=4,
                        allow_custom_value=True,
                    )
                    refresh_btn = gr.Button("Refresh", scale=1)
                    cancel_btn = gr.Button("Cancel run", variant="stop", scale=1)
                cancel_msg = gr.Markdown()
                progress_md = gr.Markdown()
                with gr.Row():
                    reward_plot = gr.Plot(label="reward", elem_id="live-reward")
                    time_plot = gr.Plot(label="step time")
                speedup_table = gr.Dataframe(
                    label="update-phase speedup: measured vs predicted", interactive=False
                )
                with gr.Row():
                    counts_plot = gr.Plot(label="backward passes")
                    probe_plot = gr.Plot(label="gradient cosine per group")
                gallery = gr.Gallery(
                    label="evaluation samples (fixed prompts and seeds)",
                    columns=6,
                    height="auto",
                    elem_id="live-gallery",
                )
                log_box = gr.Textbox(label="log", lines=12, max_lines=20, autoscroll=True)

            with gr.Tab("Compare", id="compare"):
                if shown:
                    gr.Markdown(
                        f"**Showcase** (read-only): runs #{showcase_ids[0]} (exact) and #{showcase_ids[1]} (JAGG), "
                        "recorded with `jagg train configs/tiny-shapes-cpu.yaml`, same seed, prompts and eval seeds "
                        f"(`{showcase.RECORD_COMMAND}` records them again). Pick other runs and press Compare."
                    )
                    # Drawn without plotly, so that the curves are there at the first paint; Compare draws the
                    # interactive plot below.
                    showcase_frames = {
                        f"#{run['id']} {run['config'].get('strategy')}": manager.store.metrics_frame(
                            run["id"]
                        )
                        for run in (manager.store.get_run(i) for i in showcase_ids)
                    }
                    gr.HTML(data.reward_svg(showcase_frames), elem_id="showcase-curves")
                with gr.Row():
                    compare_runs = gr.Dropdown(
                        choices=run_choices(),
                        value=list(showcase_ids) if shown else None,
                        multiselect=True,
                        label="runs (two or more)",
                        allow_custom_value=True,
                        scale=4,
                    )
                    compare_btn = gr.Button("Compare", scale=1)
                # Empty until Compare: plotly's first load is what makes a page slow to show.
                compare_plot = gr.Plot(label="reward (interactive: press Compare)", elem_id="compare-plot")
                compare_table = gr.Dataframe(
                    label="summary: final reward and update-phase speedup (measured vs predicted)",
                    interactive=False,
                    value=shown[1] if shown else None,
                )
                diff_table = gr.Dataframe(
                    label="config diff", interactive=False, value=shown[2] if shown else None
                )
                compare_gallery = gr.Gallery(
                    label="same prompt and seed, side by side: each run at its first eval, then at its last",
                    columns=4,
                    height="auto",
                    value=shown[3] if shown else None,
                    elem_id="compare-gallery",
                )

            with gr.Tab("History", id="history"):
                history_table = gr.Dataframe(label="runs", interactive=False)
                with gr.Row():
                    history_btn = gr.Button("Refresh")
                    target = gr.Number(label="run id")  # no rounding: 1.5 is refused, not run 2
                    delete_files = gr.Checkbox(label="also delete its folder", value=False)
                    delete_btn = gr.Button("Delete", variant="stop")
                    resume_btn = gr.Button("Resume")
                    export_btn = gr.Button("Export CSV + JSON")
                history_msg = gr.Markdown()
                export_files = gr.File(label="export", file_count="multiple")
                with gr.Accordion("Owner", open=False, visible=space):
                    with gr.Row():
                        password = gr.Textbox(
                            label=f"owner password (Space secret {OWNER_PASSWORD_ENV})", type="password"
                        )
                        login_btn = gr.Button("Log in")
                    login_msg = gr.Markdown()
                    with gr.Row():
                        owner_path = gr.Textbox(
                            label="file of the runs folder (jagg.db, run-0001/train.log, …)"
                        )
                        owner_btn = gr.Button("Download")
                    owner_msg = gr.Markdown()
                    owner_download = gr.File(label="owner download")

        # ------------------------------------------------------------------ events
        form = [name, backbone, model_path, rewards, algorithm, window, jagg_frac, strategy, steps, group_size, lr,
                seed, processes, overrides]  # fmt: skip
        launch_outputs = [launch_msg, launched_id, live_run]
        launch_btn.click(_with_request(launch, FORM_FIELDS), form, launch_outputs, api_name="launch_run")
        pair_btn.click(
            _with_request(launch_pair, FORM_FIELDS), form, launch_outputs, api_name="compare_exact_jagg"
        )
        for component in (window, jagg_frac, strategy, r_input):
            component.change(
                predict, [window, jagg_frac, strategy, r_input], prediction, api_visibility="private"
            )
        predict_btn = gr.Button(visible=False)
        predict_btn.click(
            predict, [window, jagg_frac, strategy, r_input], prediction, api_name="predict_speedup"
        )

        live_outputs = [
            progress_md,
            reward_plot,
            time_plot,
            speedup_table,
            counts_plot,
            probe_plot,
            gallery,
            log_box,
        ]
        live_run.change(live_view, [live_run, r_input], live_outputs, api_name="live_view")
        refresh_btn.click(live_view, [live_run, r_input], live_outputs, api_visibility="private")
        cancel_btn.click(cancel, live_run, cancel_msg, api_name="cancel_run")
        timer = gr.Timer(TICK_S)
        timer.tick(
            on_tick,
            [live_run, r_input, run_seen, list_seen],
            [*live_outputs, run_seen, live_run, list_seen],
            api_visibility="private",
            show_progress="hidden",
        )
        compare_btn.click(
            compare, [compare_runs, r_input], [compare_plot, compare_table, diff_table, compare_gallery],
            api_name="compare_runs",
        )  # fmt: skip
        compare_runs.focus(
            lambda: gr.update(choices=run_choices()), None, compare_runs, api_visibility="private"
        )
        history_btn.click(history, None, history_table, api_name="history")
        delete_btn.click(delete, [target, delete_files], [history_msg, history_table], api_name="delete_run")
        export_btn.click(export, target, [history_msg, export_files], api_name="export_run")
        resume_btn.click(resume, target, history_msg, api_name="resume_run")
        login_btn.click(login, password, login_msg, api_name="owner_login")
        owner_btn.click(owner_file, owner_path, [owner_msg, owner_download], api_name="owner_file")
        demo.load(on_load, r_input, [live_run, *live_outputs], api_visibility="private")
        demo.load(history, None, history_table, api_visibility="private")

    demo.jagg_manager = manager  # type: ignore[attr-defined]
    demo.jagg_shared = shared  # type: ignore[attr-defined]
    demo.jagg_runs_dir = root  # type: ignore[attr-defined]
    demo.jagg_guard = guard  # type: ignore[attr-defined]
    demo.jagg_showcase_ids = list(showcase_ids)  # type: ignore[attr-defined]
    demo.jagg_stop_ticker = threading.Event()  # type: ignore[attr-defined]  # set() stops the queue ticker
    if background_ticks:
        _start_ticker(shared.tick, stop=demo.jagg_stop_ticker)
    return demo


def _session(request: gr.Request | None) -> str | None:
    """The gradio session of a call (one per page load or gradio_client), None outside a request."""
    return getattr(request, "session_hash", None) or None


def _with_request(handler: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``handler(*inputs, request=...)`` as a function gradio passes the gr.Request to: gradio gives the
    request only to a named parameter annotated gr.Request, which a ``*form`` signature cannot have."""

    def call(*args: Any) -> Any:
        return handler(*args[:-1], request=args[-1])

    params = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_ONLY) for name in names]
    params.append(
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)
    )
    call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    call.__annotations__ = {"request": gr.Request}
    return call


def _start_ticker(
    tick: Callable[[], Any], every: float = TICK_S, stop: threading.Event | None = None
) -> threading.Thread:
    """Run the queue without a browser open (a finished run's paired successor still starts) until ``stop``
    is set."""
    stop = stop or threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            try:
                tick()
            except Exception as exc:  # keep the ticker alive through a transient DB error
                print(f"jagg app: queue tick failed: {exc}", flush=True)

    thread = threading.Thread(target=loop, name="jagg-queue", daemon=True)
    thread.start()
    return thread

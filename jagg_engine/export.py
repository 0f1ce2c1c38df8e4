"""`jagg export-model`: a run's trained weights as a folder the ecosystem loads, with a model card.

    jagg export-model RUN [--step N] --out DIR [--merge] [--runs-dir DIR]

``--out`` is a new or empty folder outside the runs folder and outside every run's folder (refused in one line:
inside, ``jagg reindex`` would read ``runs/run-0002`` as a run, and deleting run 1 would delete
``runs/run-0001/x``).

A checkpoint holds the trained parameters as ``p0 … p{n-1}`` (:mod:`jagg_engine.train.checkpoint`), in the
order the trainer listed them. Nothing here maps those names by hand: the run's backbone is built again from
the run's config (the same factory, so the same parameter list), the checkpoint's tensors are copied into it,
and the model's own libraries name and write the weights (the folder layout: :mod:`jagg_engine.export_format`):

- LoRA on a diffusers backbone (flux, sd3, qwen-image): peft's ``get_peft_model_state_dict`` of the transformer
  and the pipeline's ``save_lora_weights`` with the adapter's config as metadata (rank, α, target modules), as
  diffusers' own LoRA training scripts (train_dreambooth_lora_flux.py, …_sd3.py) save: the file loads
  with ``Pipeline.from_pretrained(base).load_lora_weights(DIR)``. With ``--merge`` the adapter is fused into
  the base weights (diffusers' ``fuse_lora`` then ``unload_lora``) and the transformer written instead.
- A full fine-tune: the transformer, ``save_pretrained`` (``transformer/``).
- tiny-shapes: its whole model folder (transformer, text embedding, vocabulary), ``model_path=DIR``.

Always: ``README.md`` (a model card with YAML front matter; the run's name, its base model's path and every other
string a user chose are written as their literal text, never as Markdown or HTML: :mod:`jagg_engine.markup`),
``jagg_run.json`` (run, step, config, eval
settings), ``reward_curve.png`` and, when the run logged eval images, ``before_after.png``. Everything is written
into a hidden folder beside ``--out`` (``.NAME.partial-PID``) and renamed onto it at the end, so a failure leaves
nothing half-written, and one killed mid-write (``kill -9``) leaves a partial folder that the next export into the
same folder, or ``jagg reindex`` of the runs folder (the export leaves a note of its partial folder there while it
writes: :func:`jagg_engine.export_format.begin_partial`), removes;
a full disk is one line, ``jagg export-model: error: disk full: <what was being written, named in --out>`` (exit
code 1), as a run's failure on a full disk reads.

Loading back: :func:`model_config` turns an export into the config that builds it (``model_path=DIR``; for a
LoRA export the base as ``model_path`` and ``lora_path=DIR``), which ``jagg train``, ``jagg eval --model`` and
``jagg sample --model`` use.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from .errors import DiskFullError, UsageError, disk_full_path, is_disk_full
from .export_format import (
    FORMAT,
    INFO,
    LORA_WEIGHTS,
    ExportFormatError,
    begin_partial,
    end_partial,
    read_export,
)
from .markup import md_cell, md_code_block, md_text
from .train.config import TrainConfig

# The license of each backbone's default base model (Hugging Face model-card metadata); a model_path of one's
# own is "other": its license is the base model's, which the card cannot know.
LICENSES = {
    "black-forest-labs/FLUX.1-dev": ("other", "flux-1-dev-non-commercial-license"),
    "stabilityai/stable-diffusion-3.5-medium": ("other", "stabilityai-ai-community"),
    "Qwen/Qwen-Image": ("apache-2.0", None),
    "tiny-shapes": ("apache-2.0", None),
}
TINY_SHAPES_BASE = "tiny-shapes"  # the embedded model (assets/tiny-shapes) has no hub id
GRID_PAIRS = 8  # (prompt, seed) pairs in before_after.png


# ------------------------------------------------------------------------------------------------ the run


class RunRef(NamedTuple):
    """A run of the index: its row, its config and its folder."""

    id: int
    uid: str | None
    row: dict[str, Any]
    cfg: TrainConfig
    run_dir: Path
    runs_dir: Path


def open_run(runs_dir: str | os.PathLike[str], run_id: int) -> RunRef:
    """The run ``run_id`` of ``<runs_dir>/jagg.db``; UsageError (one line) when there is none."""
    from .store import DB_NAME, StoreError, open_store

    db = Path(runs_dir) / DB_NAME
    if not db.is_file():
        raise UsageError(f"--runs-dir: no run database at {db}")
    try:
        with open_store(runs_dir) as store:
            row = store.get_run(run_id)
    except StoreError as exc:
        raise UsageError(" ".join(str(exc).split())) from None
    if row is None:
        raise UsageError(f"RUN: no run {run_id} in {db}; `jagg runs --runs-dir {runs_dir}` lists them")
    try:
        cfg = TrainConfig.from_dict(row["config"])
    except ValueError as exc:
        raise UsageError(f"RUN: run {run_id}'s config does not load here: {exc}") from None
    return RunRef(run_id, row.get("uid"), row, cfg, Path(row["run_dir"]), Path(runs_dir))


def checkpoint_steps(run: RunRef) -> dict[int, Path]:
    """The run's complete checkpoints (a manifest written): step → folder."""
    from .train import checkpoint

    found = {}
    for path in checkpoint.list_checkpoints(run.run_dir / "checkpoints"):
        if (path / checkpoint.MANIFEST).is_file():
            found[int(path.name.removeprefix("step_"))] = path
    return found


def pick_checkpoint(run: RunRef, step: int | None) -> tuple[int, Path]:
    """The checkpoint at ``step`` (None: the last); UsageError naming the steps there are otherwise."""
    found = checkpoint_steps(run)
    if not found:
        raise UsageError(
            f"RUN: run {run.id} has no checkpoint in {run.run_dir / 'checkpoints'} (checkpoint_every 0 and it"
            " never ended, or it was deleted)"
        )
    if step is None:
        step = max(found)
    if step not in found:
        have = ", ".join(str(s) for s in sorted(found))
        raise UsageError(f"--step: run {run.id} has no checkpoint at step {step}; its checkpoints: {have}")
    return step, found[step]


def asked_step(run: RunRef, step: int | None) -> int:
    """The step a command asked for with ``--step`` (None: the run's last checkpoint); UsageError for a
    negative one. Step 0 is the base model, which needs no checkpoint (:func:`load_run_model`)."""
    if step is None:
        return pick_checkpoint(run, None)[0]
    if step < 0:
        raise UsageError(f"--step: must be a whole number >= 0, got {step}")
    return step


# ------------------------------------------------------------------------------------------------ the model


def trained_parameters(model: Any, cfg: TrainConfig) -> list[torch.nn.Parameter]:
    """The parameters in the order the trainer saved them (``p0 …``): under FSDP every parameter that needs a
    gradient in module order, else the backbone's ``trainable_parameters()``."""
    if cfg.fsdp and cfg.processes > 1:
        return [p for p in model.parameters() if p.requires_grad]
    return model.trainable_parameters()


def build_model(cfg: TrainConfig, device: str | torch.device = "cpu") -> Any:
    """The run's backbone at its initial weights, as the trainer builds it, without the KL reference copy."""
    from .backbones import BackboneConfigError, build_backbone

    opts = cfg.backbone_kwargs(device=str(device))
    if "reference_copy" in opts:
        opts["reference_copy"] = False  # the reference policy is for training only
    torch.manual_seed(cfg.seed)
    try:
        model = build_backbone(cfg.backbone, **opts)
    except (BackboneConfigError, ExportFormatError, TypeError, ValueError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    if isinstance(model, torch.nn.Module):
        model.to(device).eval()
    return model


def load_run_model(run: RunRef, step: int, device: str | torch.device = "cpu") -> Any:
    """The run's model at training step ``step``: the base weights at step 0, else its checkpoint's (verified
    against the manifest and the run's uid by :func:`jagg_engine.train.checkpoint.read_main`)."""
    from .train import checkpoint

    path = None if step == 0 else pick_checkpoint(run, step)[1]
    model = build_model(run.cfg, device)
    if path is None:
        return model
    try:
        state = checkpoint.read_main(path, run.uid)
    except checkpoint.CheckpointError as exc:
        raise UsageError(f"--step: {exc}") from None
    params = trained_parameters(model, run.cfg)
    if len(state.params) != len(params) or any(
        tuple(s.shape) != tuple(p.shape) for s, p in zip(state.params, params)
    ):
        raise UsageError(
            f"--step: {path} holds {len(state.params)} tensors that do not match the {len(params)} trainable"
            f" parameters of the model its config builds"
        )
    with torch.no_grad():
        for p, saved in zip(params, state.params):
            p.copy_(saved.to(p.device, p.dtype))
    return model


def model_config(folder: str | os.PathLike[str]) -> tuple[TrainConfig, dict[str, Any]]:
    """The config that builds the model of an export (and its ``jagg_run.json``): the run's config with
    ``model_path=DIR`` (tiny-shapes; a merged or full transformer, over the base it names) or, for a LoRA export,
    the base as ``model_path`` and ``lora_path=DIR``. UsageError (one line) for a folder that is not an export."""
    folder = Path(folder).expanduser().absolute()
    try:
        info = read_export(folder)
        cfg = TrainConfig.from_dict(info["config"])
    except (ExportFormatError, ValueError) as exc:
        raise UsageError(f"--model: {exc}") from None
    kind = info["kind"]
    if kind == "lora":
        if not (folder / LORA_WEIGHTS).is_file():
            raise UsageError(f"--model: {folder} is a LoRA export without {LORA_WEIGHTS}")
        base = info["base_model"]
        cfg = dataclasses.replace(cfg, model_path=base, lora_path=str(folder))
    elif kind in ("merged", "full"):
        cfg = dataclasses.replace(cfg, model_path=str(folder), lora_rank=0, lora_alpha=None, lora_targets=[])
    else:
        cfg = dataclasses.replace(cfg, model_path=str(folder))
    return dataclasses.replace(cfg, lora_path=cfg.lora_path if kind == "lora" else None, beta=0.0), info


# ------------------------------------------------------------------------------------------------ writing


def _export_kind(run: RunRef, merge: bool) -> str:
    """lora / merged / full / tiny-shapes for the run's backbone; UsageError for one export does not write."""
    from .backbones import get_backbone

    cfg = run.cfg
    diffusers = "lora_rank" in get_backbone(cfg.backbone).options
    if cfg.backbone == "tiny-shapes":
        kind = "tiny-shapes"
    elif diffusers:
        kind = ("merged" if merge else "lora") if cfg.lora_rank > 0 else "full"
    else:
        raise UsageError(
            f"RUN: run {run.id} trained backbone {cfg.backbone!r}; export-model writes tiny-shapes and the diffusers"
            " backbones (flux, qwen-image, sd3)"
        )
    if merge and kind != "merged":
        what = "a tiny-shapes run" if kind == "tiny-shapes" else "a full fine-tune (lora_rank 0)"
        raise UsageError(
            f"--merge: run {run.id} is {what}: its export is the whole model already; leave --merge out"
        )
    return kind


def _check_out(out: Path, runs_dir: str | os.PathLike[str] | None = None) -> None:
    if runs_dir is not None:
        inside = _under_runs(out, Path(runs_dir))
        if inside is not None:
            raise UsageError(
                f"--out: {out} is inside the runs folder {inside}; pass a folder outside it (there a reindex would"
                " read it as a run's, and deleting a run would delete it)"
            )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out: {out} exists and is not an empty folder; pass a new or empty folder")
    existing = out.absolute().parent
    while not existing.exists():  # the folders to create
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--out: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK):
        raise UsageError(f"--out: cannot write to {existing}")


def _under_runs(out: Path, runs_dir: Path) -> Path | None:
    """The runs folder (or the run folder) ``out`` lies in, after symlinks and ``..``; None when outside."""
    from .store import DB_NAME

    target = out.expanduser().resolve()
    roots = [runs_dir.expanduser().resolve()]
    try:  # the run folders the index names (one may lie outside the runs folder)
        from .store import open_store

        if (runs_dir / DB_NAME).is_file():
            with open_store(runs_dir) as store:
                roots += [Path(r["run_dir"]).resolve() for r in store.list_runs() if r.get("run_dir")]
    except Exception:  # an unreadable index: open_run refuses it in its own line
        pass
    for root in roots:
        if target == root or target.is_relative_to(root):
            return root
    return None


def base_model(cfg: TrainConfig) -> str:
    """Where the run's base weights come from: its model_path or the backbone's default."""
    if cfg.model_path is not None:
        return cfg.model_path
    if cfg.backbone == "tiny-shapes":
        return TINY_SHAPES_BASE
    import importlib

    module = importlib.import_module(f"jagg_engine.backbones.{cfg.backbone.replace('-', '_')}")
    return module.DEFAULT_MODEL


def eval_settings(cfg: TrainConfig, prompts: Sequence[str]) -> dict[str, Any]:
    """The settings of the run's eval: what ``jagg eval --model`` reads back (the prompts themselves, so the
    export does not depend on a prompts file on the machine that trained)."""
    return {
        "prompts": list(prompts),
        "seeds": list(cfg.eval_seeds),
        "sampling_steps": cfg.sampling_steps,
        "shift": cfg.shift,
        "schedule": cfg.resolved_schedule(),
        "rewards": dict(cfg.rewards),
        "reward_options": dict(cfg.reward_options),
        "cfg_scale": cfg.cfg_scale,
    }


def _write_lora(model: Any, folder: Path) -> None:
    """diffusers' LoRA format, through peft's and diffusers' own functions (see the module docstring)."""
    import diffusers
    from peft.utils import get_peft_model_state_dict

    transformer = model.transformer
    # peft's key names, as diffusers' own flux / sd3 / qwen-image LoRA training scripts save them; passing them
    # through convert_state_dict_to_diffusers first ("lora.down" names) loses the first block's LoRA in
    # StableDiffusion3Pipeline.load_lora_weights (diffusers 0.42), which tests/test_export.py would catch.
    layers = get_peft_model_state_dict(transformer)
    metadata = transformer.peft_config["default"].to_dict()
    pipeline_cls = getattr(diffusers, type(model.pipe).__name__)
    pipeline_cls.save_lora_weights(
        folder, transformer_lora_layers=layers, transformer_lora_adapter_metadata=metadata
    )


def _write_transformer(model: Any, folder: Path, merge: bool) -> None:
    transformer = model.transformer
    if merge:  # diffusers: fuse the adapter into the base weights, then drop the adapter layers
        transformer.fuse_lora(lora_scale=1.0)
        transformer.unload_lora()
    transformer.save_pretrained(folder / "transformer")


class ExportResult(NamedTuple):
    folder: Path
    kind: str
    step: int


def export_model(
    runs_dir: str | os.PathLike[str],
    run_id: int,
    out: str | os.PathLike[str],
    step: int | None = None,
    merge: bool = False,
    device: str = "cpu",
) -> ExportResult:
    """Write the export of run ``run_id`` at checkpoint ``step`` (None: its last) into ``out``; see the module
    docstring. UsageError (one line, nothing written) on bad input."""
    from .store import open_store
    from .train.trainer import prompt_source

    out = Path(out).expanduser()
    _check_out(out, runs_dir)
    run = open_run(runs_dir, run_id)
    kind = _export_kind(run, merge)
    step, _ = pick_checkpoint(run, step)
    model = load_run_model(run, step, device)
    with open_store(runs_dir) as store:
        frame = store.metrics_frame(run.id)
        evals = store.samples(run.id, kind="eval")
    try:
        prompts = prompt_source(run.cfg, eval_set=True)[: run.cfg.eval_num_prompts]
    except ValueError as exc:
        raise UsageError(f"RUN: run {run.id}'s eval prompts cannot be read here: {exc}") from None

    parent = out.absolute().parent
    made = [p for p in (parent, *parent.parents) if not p.exists()]
    parent.mkdir(parents=True, exist_ok=True)
    # an export killed mid-write (kill -9) left its partial folder here: removed, and this one noted in the
    # runs folder, where `jagg reindex` looks for it
    partial = begin_partial(parent, out.name, runs_dir)
    try:
        if kind == "tiny-shapes":
            model.save_pretrained(partial)
        elif kind == "lora":
            _write_lora(model, partial)
        else:
            _write_transformer(model, partial, merge=kind == "merged")
        info = {
            "format": FORMAT,
            "kind": kind,
            "backbone": run.cfg.backbone,
            "base_model": base_model(run.cfg),
            "run": {"id": run.id, "uid": run.uid, "name": run.row.get("name")},
            "step": step,
            "config": run.cfg.to_dict(),
            "eval": eval_settings(run.cfg, prompts),
            "eval_reward": _eval_rewards(frame, step),
        }
        figures = _write_figures(partial, run, frame, evals, step)
        (partial / INFO).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        (partial / "README.md").write_text(model_card(info, figures), encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty (checked above)
        partial.rename(out)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        for folder in made:  # innermost first: the folders this call created, if still empty
            try:
                folder.rmdir()
            except OSError:
                break
        if isinstance(exc, Exception) and is_disk_full(exc):  # `disk full: <what was being written>`
            raise DiskFullError(_as_out(disk_full_path(exc, partial), partial, out)) from exc
        raise
    finally:
        end_partial(partial, runs_dir)
    return ExportResult(out, kind, step)


def _as_out(path: str, partial: Path, out: Path) -> str:
    """A path inside the hidden partial folder (gone by now) named as the user will find it: in ``--out``."""
    try:
        inside = Path(path).absolute().relative_to(partial.absolute())
    except ValueError:
        return path
    return str(out.absolute() / inside) if inside.parts else str(out.absolute())


def _logged(frame: Any, key: str, step: int) -> float | None:
    if frame.empty or key not in frame:
        return None
    rows = frame.loc[(frame["step"] == step) & frame[key].notna(), key]
    return None if rows.empty else float(rows.iloc[0])


def _eval_rewards(frame: Any, step: int) -> dict[str, Any]:
    """The logged eval reward at step 0 and at ``step`` (or at the last eval before it, named by its step)."""
    key = "eval/reward/mean"
    after_step = step
    if _logged(frame, key, step) is None and not frame.empty and key in frame:
        earlier = frame.loc[(frame["step"] <= step) & frame[key].notna(), "step"]
        after_step = int(earlier.max()) if not earlier.empty else step
    return {
        "before": {"step": 0, "mean": _logged(frame, key, 0), "std": _logged(frame, "eval/reward/std", 0)},
        "after": {
            "step": after_step,
            "mean": _logged(frame, key, after_step),
            "std": _logged(frame, "eval/reward/std", after_step),
        },
    }


def _write_figures(
    folder: Path, run: RunRef, frame: Any, evals: list[dict[str, Any]], step: int
) -> dict[str, str]:
    """reward_curve.png (train and eval reward means by step) and before_after.png (the first eval pairs at step
    0 over the same pairs at the eval step of the card); the names of those written."""
    from PIL import Image

    written = {}
    series = {}
    for key, label in (("reward/mean", "train reward"), ("eval/reward/mean", "eval reward")):
        if not frame.empty and key in frame:
            part = frame.loc[frame[key].notna() & (frame["step"] <= step), ["step", key]]
            if len(part):
                series[label] = (part["step"].to_numpy(float), part[key].to_numpy(float))
    if series:
        line_chart(series, f"run {run.id}: reward by step", folder / "reward_curve.png")
        written["reward_curve"] = "reward_curve.png"
    steps = sorted({s["step"] for s in evals})
    after = max((s for s in steps if s <= step), default=None)
    if 0 in steps and after not in (None, 0):
        from .imaging import image_grid

        def pictures(at: int) -> list[np.ndarray]:
            rows = [s for s in evals if s["step"] == at][:GRID_PAIRS]
            return [np.asarray(Image.open(run.run_dir / s["path"]).convert("RGB")) for s in rows]

        before, later = pictures(0), pictures(after)
        n = min(len(before), len(later))
        if n:
            images = np.stack(before[:n] + later[:n])  # (2n, H, W, 3): the before row over the after row
            scale = max(1, 96 // images.shape[1])
            Image.fromarray(image_grid(images, n, scale)).save(folder / "before_after.png")
            written["before_after"] = "before_after.png"
            written["after_step"] = str(after)
    return written


def line_chart(series: dict[str, tuple[np.ndarray, np.ndarray]], title: str, path: Path) -> None:
    """A small PNG line chart of ``series`` (label → (x, y)), drawn with PIL (no plotting dependency)."""
    from PIL import Image, ImageDraw

    width, height, left, right, top, bottom = 640, 360, 60, 20, 36, 40
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    xs = np.concatenate([x for x, _ in series.values()])
    ys = np.concatenate([y for _, y in series.values()])
    x0, x1 = float(xs.min()), float(xs.max()) or 1.0
    y0, y1 = float(ys.min()), float(ys.max())
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def at(x: float, y: float) -> tuple[float, float]:
        px = left + (x - x0) / (x1 - x0) * (width - left - right)
        py = height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)
        return px, py

    draw.rectangle([left, top, width - right, height - bottom], outline="black")
    for frac in (0.0, 0.5, 1.0):
        y = y0 + frac * (y1 - y0)
        draw.text((4, at(x0, y)[1] - 6), f"{y:.3f}", fill="black")
        x = x0 + frac * (x1 - x0)
        draw.text((at(x, y0)[0] - 8, height - bottom + 6), f"{x:g}", fill="black")
    draw.text((left, 10), title, fill="black")
    draw.text((width // 2 - 12, height - 16), "step", fill="black")
    colours = ["#1f77b4", "#d62728", "#2ca02c"]
    for i, (label, (x, y)) in enumerate(series.items()):
        colour = colours[i % len(colours)]
        points = [at(float(a), float(b)) for a, b in zip(x, y)]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2)
        for px, py in points:
            draw.ellipse([px - 2, py - 2, px + 2, py + 2], fill=colour)
        draw.text((width - right - 120, top + 6 + 14 * i), label, fill=colour)
    image.save(path)


def _fmt(value: float | None) -> str:
    return "not logged" if value is None else f"{value:.4f}"


def model_card(info: dict[str, Any], figures: dict[str, str]) -> str:
    """The export's README.md: Hugging Face model-card front matter and a short account of the run."""
    import yaml

    cfg = info["config"]
    base = info["base_model"]
    license_id, license_name = LICENSES.get(base, ("other", None))
    tags = ["text-to-image", "diffusers", "grpo", "jagg-studio", info["backbone"]]
    if info["kind"] == "lora":
        tags.append("lora")
    front: dict[str, Any] = {"base_model": base, "library_name": "diffusers", "license": license_id}
    if license_name:
        front["license_name"] = license_name
    front["tags"] = tags
    run = info["run"]
    before, after = info["eval_reward"]["before"], info["eval_reward"]["after"]
    ev = info["eval"]
    window = (
        f"{cfg['sde_window_schedule']} window of W = {cfg['window']} inside sampling steps "
        f"{cfg['sde_window_start']}..{cfg['sde_window_end']} of {cfg['sampling_steps']}"
    )
    rewards = ", ".join(f"{k} × {v:g}" for k, v in cfg["rewards"].items())
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).strip(),
        "---",
        "",
        f"# {md_text(run['name'] or 'run')} (JAGG Studio run {run['id']}, step {info['step']})",
        "",
        f"GRPO alignment of {md_text(base)} ({md_text(info['backbone'])}) with JAGG Studio. This folder holds"
        f" the weights of the run's checkpoint at step {info['step']} as **{_KIND_TEXT[info['kind']]}**.",
        "",
        "| | |",
        "|---|---|",
        f"| run | {run['id']} (uid {md_cell(run['uid'])}) |",
        f"| strategy | {md_cell(cfg['strategy'])} (jagg_frac {cfg['jagg_frac']:g}) |",
        f"| window | {md_cell(window)} |",
        f"| SDE | {md_cell(cfg['algorithm'])}, η = {cfg['eta']:g}, {cfg['group_size']} samples per prompt, "
        f"{cfg['prompts_per_step']} prompts per step |",
        f"| optimizer | AdamW lr {cfg['lr']:g}, {cfg['steps']} steps planned |",
        f"| LoRA | rank {cfg['lora_rank']}, alpha {cfg['lora_alpha'] or cfg['lora_rank']} |"
        if cfg["lora_rank"]
        else "| weights | full fine-tune |",
        f"| rewards | {md_cell(rewards)} |",
        f"| eval reward, step 0 | {_fmt(before['mean'])} |",
        f"| eval reward, step {after['step']} | {_fmt(after['mean'])} |",
        "",
        f"The eval: {len(ev['prompts'])} prompts × seeds {ev['seeds']}, {ev['sampling_steps']} deterministic ODE"
        f" steps ({md_text(ev['schedule'])} schedule), scored by the rewards above. `jagg eval --model <this"
        " folder>` repeats it.",
        "",
    ]
    if "reward_curve" in figures:
        lines += ["![reward by step](reward_curve.png)", ""]
    if "before_after" in figures:
        lines += [
            f"![eval images at step 0 (top) and step {figures['after_step']} (bottom)](before_after.png)",
            "",
            f"Top: step 0 (the base model); bottom: step {figures['after_step']}; the same prompts and seeds.",
            "",
        ]
    lines += ["## Use", "", md_code_block("\n".join(_usage(info)), "python"), ""]
    lines += ["The run's whole config and eval settings are in `jagg_run.json`.", ""]
    return "\n".join(lines)


_KIND_TEXT = {
    "lora": "a LoRA in diffusers' format (`pytorch_lora_weights.safetensors`)",
    "merged": "the transformer with the LoRA merged in (`transformer/`)",
    "full": "the fully fine-tuned transformer (`transformer/`)",
    "tiny-shapes": "the whole tiny-shapes model folder",
}
_PIPELINES = {"flux": "FluxPipeline", "sd3": "StableDiffusion3Pipeline", "qwen-image": "QwenImagePipeline"}
_TRANSFORMERS = {
    "flux": "FluxTransformer2DModel",
    "sd3": "SD3Transformer2DModel",
    "qwen-image": "QwenImageTransformer2DModel",
}


def _usage(info: dict[str, Any]) -> list[str]:
    base, kind, backbone = info["base_model"], info["kind"], info["backbone"]
    if kind == "tiny-shapes":
        return [
            "from jagg_engine.backbones import build_backbone",
            "",
            'model = build_backbone("tiny-shapes", weights_dir="path/to/this/folder")',
        ]
    pipe = _PIPELINES[backbone]
    if kind == "lora":
        return [
            f"from diffusers import {pipe}",
            "",
            f"pipe = {pipe}.from_pretrained({_py_str(base)})",
            'pipe.load_lora_weights("path/to/this/folder")',
        ]
    tf = _TRANSFORMERS[backbone]
    return [
        f"from diffusers import {pipe}, {tf}",
        "",
        f'transformer = {tf}.from_pretrained("path/to/this/folder", subfolder="transformer")',
        f"pipe = {pipe}.from_pretrained({_py_str(base)}, transformer=transformer)",
    ]


def _py_str(text: str) -> str:
    """``text`` as a one-line Python string literal (quotes, backslashes and line breaks escaped)."""
    return json.dumps(str(text))


# ------------------------------------------------------------------------------------------------ the command


def _run_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"RUN: must be a run id (a whole number), got {text!r}") from None
    if not 1 <= value <= 2**63 - 1:
        raise argparse.ArgumentTypeError(f"RUN: must be a whole number from 1 to {2**63 - 1}, got {value}")
    return value


def _step(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--step: must be a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--step: must be a whole number >= 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``jagg export-model``."""
    parser.add_argument("run_id", type=_run_id, metavar="RUN", help="run id shown by `jagg runs`")
    parser.add_argument("--step", type=_step, default=None, help="checkpoint step (default: the run's last)")
    parser.add_argument("--out", type=Path, required=True, help="new (or empty) folder to write")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="LoRA runs: write the merged transformer/ instead of the LoRA file",
    )
    parser.add_argument("--runs-dir", default="runs", help="runs root holding jagg.db (default: runs)")
    parser.add_argument("--device", default="cpu", help="where the model is rebuilt (default: cpu)")


def run(args: argparse.Namespace) -> int:
    from .devices import resolve_device

    result = export_model(
        args.runs_dir, args.run_id, args.out, args.step, args.merge, str(resolve_device(args.device))
    )
    print(f"wrote {result.folder} ({result.kind}, run {args.run_id} at step {result.step})")
    return 0

"""The folder ``jagg export-model`` writes, as the rest of the code reads it (no torch: the config validator and
the app read it too).

One export is one folder::

    README.md                           model card: YAML front matter (base_model, library_name, tags, license),
                                        the run's setting, its eval reward before and after, the figures below
    jagg_run.json                       this module's INFO: format, kind, backbone, base model, run, step,
                                        the run's config and its eval settings (prompts included)
    reward_curve.png, before_after.png  the run's reward curves; its eval images at step 0 and at the step
    pytorch_lora_weights.safetensors    kind "lora": diffusers' LoRA format (``load_lora_weights(folder)``)
    transformer/                        kinds "merged" and "full": the transformer, ``save_pretrained``
    transformer/, text_embedding.safetensors, vocab.json
                                        kind "tiny-shapes": the whole model folder (``model_path=folder``)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

FORMAT = 1
INFO = "jagg_run.json"
LORA_WEIGHTS = "pytorch_lora_weights.safetensors"
KINDS = ("lora", "merged", "full", "tiny-shapes")


# An export being written: ``.NAME.partial-PID`` beside its ``--out`` (a folder; the app's zip: ``….zip``), renamed
# onto NAME when whole. One whose process is gone (killed mid-export) is removed by the next export into the same
# folder and by ``jagg reindex`` (:func:`remove_stale_partials`).
PARTIAL = re.compile(r"^\.(?P<name>.+)\.partial-(?P<pid>\d+)(?:\.zip)?$")


def partial_path(folder: Path, name: str, suffix: str = "") -> Path:
    """Where this process writes ``folder/name`` before renaming it there: ``folder/.NAME.partial-PID``."""
    return folder / f".{name}.partial-{os.getpid()}{suffix}"


def remove_stale_partials(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the partial exports in ``folder`` whose writing process is gone (not this one, not a live one:
    a pid taken again by a process started after the partial was last written counts as gone). Returns them."""
    from .store import pid_alive

    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return []
    for entry in entries:
        match = PARTIAL.match(entry.name)
        if not match:
            continue
        pid = int(match.group("pid"))
        try:
            written = entry.lstat().st_mtime
        except OSError:
            continue
        if pid == os.getpid() or pid_alive(pid, written):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            try:
                entry.unlink()
            except OSError:
                pass
        if not entry.exists():
            removed.append(entry)
    return removed


# An export whose ``--out`` lies outside the runs folder leaves a note in it while it writes, naming its partial
# folder, so that ``jagg reindex`` finds a partial that a killed export left anywhere (:func:`begin_partial`).
PENDING = ".exports-being-written"  # under the runs folder: one file ``PID-<hash>`` per export being written


def _note_of(runs_dir: str | os.PathLike[str], partial: Path) -> Path:
    digest = hashlib.sha256(str(partial.absolute()).encode()).hexdigest()[:12]
    return Path(runs_dir) / PENDING / f"{os.getpid()}-{digest}"


def begin_partial(parent: Path, name: str, runs_dir: str | os.PathLike[str] | None) -> Path:
    """A new, empty partial folder for ``parent/name`` (:func:`partial_path`): the stale partials of
    ``parent`` removed first, and a note naming it left in ``runs_dir`` (:data:`PENDING`) until
    :func:`end_partial`, where ``jagg reindex`` looks (:func:`remove_noted_partials`). A runs folder that
    takes no note (read-only) only loses that: the next export into ``parent`` still removes the partial."""
    remove_stale_partials(parent)
    partial = partial_path(parent, name)
    shutil.rmtree(partial, ignore_errors=True)
    if runs_dir is not None:
        note = _note_of(runs_dir, partial)
        try:
            note.parent.mkdir(exist_ok=True)
            note.write_text(str(partial.absolute()), encoding="utf-8")
        except OSError:
            pass
    partial.mkdir()
    return partial


def end_partial(partial: Path, runs_dir: str | os.PathLike[str] | None) -> None:
    """The export of ``partial`` ended (renamed onto its ``--out``, or removed): its note goes."""
    if runs_dir is not None:
        note = _note_of(runs_dir, partial)
        note.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the last export out: no empty folder left in the runs folder
            note.parent.rmdir()


def remove_noted_partials(runs_dir: str | os.PathLike[str]) -> list[Path]:
    """The partial folders named by the notes in ``runs_dir`` (:data:`PENDING`) whose export process is gone,
    removed with their notes. Only a folder named as a partial of that process (``.NAME.partial-PID``) is
    ever removed. Returns the folders removed."""
    from .store import pid_alive

    removed = []
    try:
        notes = sorted((Path(runs_dir) / PENDING).iterdir())
    except OSError:
        return []
    for note in notes:
        pid = note.name.split("-", 1)[0]
        try:
            alive = not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid), note.stat().st_mtime)
            folder = Path(note.read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            continue
        if alive:
            continue
        match = PARTIAL.match(folder.name)
        if match and match.group("pid") == pid and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
        if not folder.exists():
            note.unlink(missing_ok=True)
    return removed


class ExportFormatError(ValueError):
    """A folder that is not a readable export; the message is one line."""


def read_export(folder: str | Path) -> dict[str, Any]:
    """The ``jagg_run.json`` of an export folder, checked for the keys the loaders read."""
    folder = Path(folder).expanduser()
    path = folder / INFO
    if not folder.is_dir():
        raise ExportFormatError(f"{folder}: no such folder")
    if not path.is_file():
        raise ExportFormatError(
            f"{folder}: not a jagg export (no {INFO}); pass a folder written by `jagg export-model`"
        )
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:  # 200 k nested brackets: json's recursion limit, not a ValueError
        raise ExportFormatError(f"{path}: unreadable (nested too deeply)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ExportFormatError(f"{path}: unreadable ({type(exc).__name__})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise ExportFormatError(f"{path}: not an export of format {FORMAT}")
    missing = [k for k in ("kind", "backbone", "base_model", "step", "config", "eval") if k not in info]
    if missing:
        raise ExportFormatError(f"{path}: lacks {', '.join(missing)}")
    if info["kind"] not in KINDS:
        raise ExportFormatError(f"{path}: kind must be one of {', '.join(KINDS)}, got {info['kind']!r}")
    if not isinstance(info["config"], dict):
        raise ExportFormatError(f"{path}: config must be a mapping")
    return info


def export_kind(folder: str | Path) -> str | None:
    """The kind of the export in ``folder``, or None when it holds no readable ``jagg_run.json``."""
    try:
        return read_export(folder)["kind"]
    except ExportFormatError:
        return None


def missing_lora_files(folder: Path) -> list[str]:
    """What a LoRA export (``lora_path``) lacks: the folder, or its diffusers LoRA weights."""
    if not folder.is_dir():
        return [f"the folder {folder}"]
    return [] if (folder / LORA_WEIGHTS).is_file() else [LORA_WEIGHTS]

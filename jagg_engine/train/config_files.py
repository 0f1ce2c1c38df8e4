"""What a config names on disk: prompt files (:func:`read_prompts`), a ``model_path`` that is a local path or a
hub id (:func:`model_path_kind`), and the runs root a run is written under (:func:`check_runs_dir`).

``model_path``: ``None`` means the backbone's default. A path that exists is accepted. A string shaped like a
Hugging Face hub id (``owner/name``, no leading ``/``, ``./``, ``../`` or ``~``, no file suffix, and whose
first component is not an existing local folder) is accepted without a check — the backbone downloads it or
fails with its own message. Anything else that does not exist is an error. This is what lets the shipped GPU
configs name hub ids and still validate on a machine without the weights.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from jagg_engine.train.config_parse import ConfigError, _brief, _one_line

PROMPT_SUFFIXES = (".txt", ".jsonl")
_WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt", ".bin", ".gguf")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_runs_dir(path: str | os.PathLike[str], field_name: str = "output_dir") -> Path:
    """Make sure the runs root ``path`` can hold a history: create it if missing, write and delete a probe file.

    Refused with a one-line ConfigError naming ``field_name``: a NUL byte or a too-long name, a file in the
    way, a folder that cannot be created or written (read-only filesystem, no permission). Returns the path.
    Called once the config validated, just before the store is opened, so a refusal leaves nothing behind
    (a folder created by this call is removed again when the probe fails).
    """
    text = os.fspath(path)
    if not text or "\0" in text:
        raise ConfigError(f"{field_name}: must be a folder path without NUL bytes, got {_brief(text)}")
    if not text.isprintable():  # a newline or tab in a folder name breaks logs, tables and shell scripts
        raise ConfigError(
            f"{field_name}: must be a folder path of printable characters (no newline, tab or control"
            f" character), got {_brief(text)}"
        )
    folder = Path(text).expanduser()
    for part in folder.parts:
        if len(os.fsencode(part)) > 255:
            raise ConfigError(f"{field_name}: the name {part[:40]!r}… is longer than 255 bytes")
    if len(os.fsencode(str(folder.absolute()))) >= 4096:
        raise ConfigError(f"{field_name}: the path is longer than 4095 bytes")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{field_name}: {text} is a file, not a folder")
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{field_name}: cannot create {text}: {existing} is a file, not a folder")
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        if created:
            _remove_empty_chain(folder, existing)
        raise ConfigError(
            f"{field_name}: cannot write to {text}: {exc.strerror or _one_line(str(exc))}"
        ) from None
    return folder


def _remove_empty_chain(folder: Path, stop: Path) -> None:
    """Remove ``folder`` and its empty parents up to (not including) ``stop``; ignore what cannot go."""
    current = folder.absolute()
    while current != stop and current != current.parent:
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent


def read_prompts(path: str | os.PathLike[str], field_name: str = "prompts_file") -> list[str]:
    """Prompts from a .txt (one a line, blank lines skipped) or .jsonl file (objects with a "prompt" key)."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{field_name}: no such file: {path}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{field_name}: {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{field_name}: cannot read {path}: {_one_line(str(exc))}") from None
    prompts = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if p.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{field_name}: {path} line {lineno} is not JSON") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise ConfigError(f"{field_name}: {path} line {lineno} needs a string 'prompt' key")
            prompts.append(obj["prompt"])
        else:
            prompts.append(line.strip())
    if not prompts:
        raise ConfigError(f"{field_name}: {path} holds no prompts")
    return prompts


def model_path_kind(path: str) -> str:
    """ "local" (exists), "hub" (looks like a hub id ``owner/name``) or "missing" — see the module docstring."""
    if os.path.exists(os.path.expanduser(path)):  # False, not an error, for an impossible path
        return "local"
    looks_local = (
        path.startswith(("/", "./", "../", "~", "."))
        or path.endswith(_WEIGHT_SUFFIXES)
        or not _HUB_ID.match(path)
        or os.path.isdir(path.split("/")[0])
    )
    return "missing" if looks_local else "hub"

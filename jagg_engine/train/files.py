"""Files a run writes beside the store: atomically (:func:`write_atomic`, a full disk named in one line), its
sample images (:func:`save_pngs`), and the space reserve that leaves room for the run's final status on a full
disk (:func:`reserve_space`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from jagg_engine.errors import DiskFullError, is_disk_full

SPACE_RESERVE = ".space-reserve"
SPACE_RESERVE_BYTES = 1 << 20


def write_atomic(path: Path, write: Any) -> None:
    """``write(tmp)`` then rename onto ``path``: a failed or killed write leaves no partial file. A full disk
    raises :class:`DiskFullError` naming ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, Exception) and is_disk_full(exc):
            raise DiskFullError(path) from exc
        raise


def reserve_space(run_dir: Path) -> Path:
    """A 1 MiB file of zeros in the run folder, deleted when the run ends: on a full disk, deleting it first
    leaves room for the run's final status to be written to the history (a "ballast" file)."""
    path = run_dir / SPACE_RESERVE
    write_atomic(path, lambda tmp: tmp.write_bytes(bytes(SPACE_RESERVE_BYTES)))
    return path


def save_pngs(run_dir: Path, folder: str, images: torch.Tensor, names: list[str]) -> list[str]:
    """``images`` (uint8, (N, H, W, C)) as PNG files ``names`` in ``run_dir / folder``, each written atomically;
    their paths relative to ``run_dir``. A full disk raises :class:`DiskFullError` naming the folder or file."""
    out = run_dir / folder
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise (DiskFullError(out) if is_disk_full(exc) else exc) from exc
    paths = []
    for img, name in zip(images, names):
        picture = Image.fromarray(img.numpy())
        write_atomic(out / name, lambda tmp, picture=picture: picture.save(tmp, format="PNG"))
        paths.append(f"{folder}/{name}")
    return paths

"""Checkpoints that cannot lie: tensors in safetensors, the rest in JSON, a sha256 manifest checked on load.

One checkpoint is one folder ``<run_dir>/checkpoints/step_NNNNN/``::

    weights.safetensors           trainable parameters "p0" … "p{n-1}", full tensors (gathered under FSDP)
    optimizer.safetensors/.json   the optimizer: tensors "<index>/<name>" and the JSON rest (param_groups,
                                  non-tensor state); under FSDP one pair per rank, ``optimizer_rankR.*``,
                                  holding that rank's local shards
    rng.safetensors               torch's CPU generator state and numpy's MT19937 key
    state.json                    step, the numpy generator's scalars, world size, fsdp
    manifest.json                 written last: format, step, the run's uid and every file above with its
                                  size and sha256

A checkpoint belongs to its run: the manifest carries the run's unique id (``run_uid``, from the store), and
:func:`load_latest` given a ``run_uid`` refuses a checkpoint of any other run (or of none: one written before
checkpoints named their run), and one whose step is past ``max_step`` (the run's last logged step: a checkpoint
ahead of the history would resume as if steps nobody logged had trained). Nothing non-finite is ever written:
:func:`save` refuses weights or optimizer moments with NaN or inf.

Nothing here unpickles: safetensors holds raw tensors and JSON holds numbers and strings, so a file placed
in a checkpoint folder can at worst be refused, never run.

Writing (:func:`save`): every file goes into ``.step_NNNNN.partial/`` and is fsync'ed, the manifest last, then
one ``rename`` makes the folder ``step_NNNNN`` — a kill leaves a ``.partial`` folder (removed by the next save)
or nothing, never a checkpoint that looks complete. A failed write (a full disk: :class:`DiskFullError` naming
the file) removes the partial folder before it raises. Only the newest ``keep`` checkpoints are kept.

Reading (:func:`load_latest`): rank 0 tries its candidates newest first: the manifest is read, the files are
hashed against it, decoded, and every floating tensor must be finite; a refused checkpoint is named in one line
and the next older one is tried. Rank 0 sends the checkpoint it found to every rank (ranks on other machines
cannot read its disk); under FSDP each rank checks its own optimizer shard against rank 0's manifest and the
ranks agree, so a shard that is corrupt on one rank makes every rank fall back together.

Several machines: each machine has its own ``checkpoints/`` folder. Machine 0's holds the whole checkpoint;
under FSDP the others hold only their ranks' shards (in a folder of the same name, committed after machine 0's),
whose sizes and hashes are in machine 0's manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from jagg_engine.errors import DiskFullError, is_disk_full

log = logging.getLogger("jagg.train")

FORMAT = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
RNG = "rng.safetensors"
STATE = "state.json"
STEP_DIR = re.compile(r"^step_(\d{5,})$")

Gather = Callable[
    [str], list[str]
]  # every rank's string, in rank order (a collective under several processes)


def _alone(value: str) -> list[str]:
    return [value]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing file, hash mismatch, not finite …); the message is one line."""


@dataclass
class CheckpointState:
    """What a checkpoint restores. ``optimizer`` is an optimizer ``state_dict`` with this rank's plain tensors
    (under FSDP :func:`restore` wraps them back into DTensors of its parameters' placements)."""

    step: int
    params: list[torch.Tensor]
    optimizer: dict[str, Any]
    torch_rng: torch.Tensor
    numpy_rng: tuple[Any, ...]
    path: Path
    distributed: frozenset[tuple[int, str]] = frozenset()  # optimizer entries saved from DTensor shards
    sharded: bool = False  # the optimizer is in per-rank files (FSDP)
    files: dict[str, Any] = field(default_factory=dict)  # the manifest's entries


# ------------------------------------------------------------------------------------------------ writing


def step_name(step: int) -> str:
    return f"step_{step:05d}"


def optimizer_stem(sharded: bool, rank: int) -> str:
    return f"optimizer_rank{rank}" if sharded else "optimizer"


def save(
    folder: Path,
    step: int,
    params: Sequence[torch.Tensor],
    optimizer_state: dict[str, Any],
    *,
    rank: int = 0,
    world: int = 1,
    sharded: bool = False,
    keep: int = 2,
    gather: Gather = _alone,
    local_main: bool | None = None,
    run_uid: str | None = None,
) -> Path | None:
    """Write the checkpoint of ``step`` atomically; every rank calls it (a collective when ``world > 1``).

    ``params`` are full tensors (only rank 0's are written); ``optimizer_state`` is this rank's
    ``optimizer.state_dict()``, written by every rank when ``sharded`` (FSDP), else by rank 0 only.
    ``folder`` is this machine's: under FSDP on several machines each rank's shard stays on its machine, its
    size and sha256 go into rank 0's manifest, and ``local_main`` (the first process of each machine,
    default: rank 0) prepares and commits that machine's folder. Returns the checkpoint folder on rank 0,
    None elsewhere. Raises :class:`DiskFullError` (naming the file) or :class:`CheckpointError` on every rank
    when any rank's write failed; nothing partial is left. Weights or optimizer tensors with NaN or inf are
    refused (CheckpointError, nothing written). ``run_uid`` goes into the manifest (see the module notes).
    """
    folder = Path(folder)
    main = rank == 0
    local_main = main if local_main is None else local_main
    partial = folder / f".{step_name(step)}.partial"
    final = folder / step_name(step)

    def begin() -> dict[str, Any]:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(".step_*.partial"):  # left by a process killed while writing
            shutil.rmtree(stale, ignore_errors=True)
        partial.mkdir()
        return {}

    def write_shard() -> dict[str, Any]:
        stem = optimizer_stem(True, rank)
        _refuse_non_finite(step, f"optimizer state of rank {rank}", _optimizer_tensors(optimizer_state))
        _write_optimizer(partial, stem, optimizer_state)
        return {n: _entry(partial / n) for n in (f"{stem}.safetensors", f"{stem}.json")}

    def write_main(shards: dict[str, Any]) -> dict[str, Any]:
        _refuse_non_finite(step, "weights", {f"p{i}": p for i, p in enumerate(params)})
        if not sharded:
            _refuse_non_finite(step, "optimizer state", _optimizer_tensors(optimizer_state))
        _write_tensors(partial / WEIGHTS, {f"p{i}": p for i, p in enumerate(params)})
        if not sharded:
            _write_optimizer(partial, optimizer_stem(False, 0), optimizer_state)
        kind, key, pos, has_gauss, cached = np.random.get_state()
        _write_tensors(
            partial / RNG,
            {"torch": torch.get_rng_state(), "numpy_key": torch.from_numpy(key.astype(np.int64))},
        )
        _write_json(
            partial / STATE,
            {
                "step": step,
                "world": world,
                "fsdp": sharded,
                "numpy_rng": [kind, int(pos), int(has_gauss), float(cached)],
            },
        )
        own = [WEIGHTS, RNG, STATE] + ([] if sharded else [f"{optimizer_stem(False, 0)}.{x}" for x in EXTS])
        files = {**shards, **{n: _entry(partial / n) for n in own}}
        _write_json(
            partial / MANIFEST,
            {"format": FORMAT, "step": step, "run_uid": run_uid, "files": dict(sorted(files.items()))},
        )
        commit()
        return {}

    def commit() -> None:
        _fsync_dir(partial)
        if final.exists():  # the same step saved again (a cancel right after a resume): replace it
            old = folder / f".{step_name(step)}.old.partial"
            final.rename(old)
            partial.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            partial.rename(final)
        _fsync_dir(folder)
        prune(folder, keep)

    local_main = main or (sharded and local_main)  # other machines write only FSDP shards
    _collective(gather, begin if local_main else None, partial, local_main)
    shards: dict[str, Any] = {}
    if sharded:
        for files in _collective(gather, write_shard, partial, local_main):
            shards.update(files)
    _collective(gather, (lambda: write_main(shards)) if main else None, partial, local_main)
    if local_main and not main and partial.exists():  # another machine: its shards become its checkpoint
        commit()
    if main:
        log.info("checkpoint saved at step %d", step)
        return final
    return None


EXTS = ("safetensors", "json")


def _optimizer_tensors(state_dict: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        f"{index}/{name}": t
        for index, entry in (state_dict.get("state") or {}).items()
        for name, t in entry.items()
        if isinstance(t, torch.Tensor)
    }


def _refuse_non_finite(step: int, what: str, tensors: dict[str, torch.Tensor]) -> None:
    """Never write a checkpoint that could not be loaded back: NaN or inf anywhere refuses the save."""
    for key, t in tensors.items():
        local = t.to_local() if hasattr(t, "to_local") else t
        if local.is_floating_point() and not torch.isfinite(local).all():
            raise CheckpointError(
                f"checkpoint of step {step} not written: {what} {key!r} has non-finite values"
            )


def _entry(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256(path)}


def _collective(
    gather: Gather, action: Callable[[], dict[str, Any]] | None, partial: Path, local_main: bool
) -> list[dict[str, Any]]:
    """Run ``action`` on this rank (if any), share every rank's outcome (what it returned, or its error), and
    raise the first failure on every rank after each machine's first process has removed its partial folder.
    Returns every rank's result."""
    outcome: dict[str, Any] = {"error": "", "result": {}}
    own = None
    if action is not None:
        try:
            outcome["result"] = action()
        except Exception as exc:  # noqa: BLE001 — every failure is shared so that no rank waits forever
            own = _as_write_error(exc)
            outcome["error"] = str(own)
    outcomes = [json.loads(o) for o in gather(json.dumps(outcome))]
    failed = next((o["error"] for o in outcomes if o["error"]), "")
    if not failed:
        return [o["result"] for o in outcomes]
    if local_main:
        shutil.rmtree(partial, ignore_errors=True)
    if own is not None and str(own) == failed:
        raise own
    if failed.startswith("disk full: "):
        raise DiskFullError(failed.removeprefix("disk full: "))
    raise CheckpointError(f"checkpoint write failed on another process: {failed}")


def _as_write_error(exc: Exception) -> Exception:
    if isinstance(exc, (DiskFullError, CheckpointError)):
        return exc
    if is_disk_full(exc):
        return DiskFullError(getattr(exc, "filename", None) or "checkpoint")
    if isinstance(exc, OSError):
        return CheckpointError(f"checkpoint write failed: {exc}")
    return exc


def prune(folder: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` checkpoints (by step)."""
    for old in list_checkpoints(folder)[: -keep if keep > 0 else None]:
        shutil.rmtree(old, ignore_errors=True)


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    plain = {k: t.detach().cpu().contiguous() for k, t in tensors.items()}
    try:
        save_file(plain, str(path))
    except SafetensorError as exc:
        if "os error 28" in str(exc) or "No space left" in str(exc):
            raise DiskFullError(path) from exc
        raise CheckpointError(f"checkpoint write failed: {path}: {exc}") from exc
    _fsync_file(path)


def _write_json(path: Path, doc: Any) -> None:
    try:
        with path.open("w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise (DiskFullError(path) if is_disk_full(exc) else exc) from exc


def _fsync_file(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise (DiskFullError(path) if is_disk_full(exc) else exc) from exc


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a folder
    finally:
        os.close(fd)


def _local(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    from torch.distributed.tensor import DTensor

    return (t.to_local(), True) if isinstance(t, DTensor) else (t, False)


def _write_optimizer(folder: Path, stem: str, state_dict: dict[str, Any]) -> None:
    """An optimizer state_dict as ``<stem>.safetensors`` (tensors) + ``<stem>.json`` (everything else)."""
    tensors: dict[str, torch.Tensor] = {}
    state: dict[str, dict[str, Any]] = {}
    for index, entry in state_dict["state"].items():
        doc: dict[str, Any] = {}
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                local, distributed = _local(value)
                tensors[f"{index}/{name}"] = local
                doc[name] = {"tensor": f"{index}/{name}", "dtensor": distributed}
            else:
                doc[name] = {"value": value}
        state[str(index)] = doc
    _write_tensors(folder / f"{stem}.safetensors", tensors)
    _write_json(folder / f"{stem}.json", {"param_groups": state_dict["param_groups"], "state": state})


# ------------------------------------------------------------------------------------------------ reading


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoint folders (complete or not) of ``folder``, oldest first."""
    if not Path(folder).is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in Path(folder).iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()
    ]
    return [p for _, p in sorted(found)]


def sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files = doc["files"]
        if doc.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError("unknown format")
        return doc
    except FileNotFoundError:
        raise CheckpointError(f"{path / MANIFEST}: missing (the checkpoint is incomplete)") from None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CheckpointError(f"{path / MANIFEST}: unreadable ({type(exc).__name__})") from None


def verify(path: Path, names: Sequence[str], files: dict[str, Any] | None = None) -> None:
    """Check ``names`` of checkpoint ``path`` against its manifest (or the manifest entries ``files``, for a
    folder of another machine's shards): size, then sha256. One-line errors."""
    files = read_manifest(path)["files"] if files is None else files
    for name in names:
        entry = files.get(name)
        file = path / name
        if entry is None:
            raise CheckpointError(f"{file}: not in the manifest")
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"{file}: missing") from None
        if size != entry["bytes"]:
            raise CheckpointError(f"{file}: {size} bytes, the manifest says {entry['bytes']} (truncated?)")
        if sha256(file) != entry["sha256"]:
            raise CheckpointError(f"{file}: sha256 does not match the manifest (corrupt)")


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable safetensors ({exc})") from None


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: unreadable JSON ({type(exc).__name__})") from None


def _require_finite(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    for key, t in tensors.items():
        # a finite sum proves every element finite (one cheap reduction); a non-finite sum may be an overflow
        if t.is_floating_point() and not torch.isfinite(t.sum()) and not torch.isfinite(t).all():
            raise CheckpointError(f"{path}: tensor {key!r} has non-finite values")


def read(path: Path, rank: int = 0) -> CheckpointState:
    """Verify and decode checkpoint ``path`` (one folder holding every file) as seen by ``rank``."""
    state = read_main(path)
    if state.sharded:
        state.optimizer, state.distributed = read_optimizer(path, optimizer_stem(True, rank), state.files)
    return state


def read_main(path: Path, run_uid: str | None = None) -> CheckpointState:
    """Verify and decode what rank 0 reads: weights, RNG, step, and the optimizer unless it is per rank
    (then ``optimizer`` is empty: :func:`read_optimizer` reads each rank's own). With ``run_uid``, a
    checkpoint of another run is refused. Raises CheckpointError."""
    path = Path(path)
    manifest = read_manifest(path)
    files = manifest["files"]
    if run_uid is not None and manifest.get("run_uid") != run_uid:
        owner = manifest.get("run_uid")
        owner = f"run {owner}" if owner else "no run (written before checkpoints named their run)"
        raise CheckpointError(f"{path}: belongs to {owner}, not to this run ({run_uid})")
    verify(path, [STATE], files)
    state = _load_json(path / STATE)
    try:
        sharded = bool(state["fsdp"])
        step = int(state["step"])
        kind, pos, has_gauss, cached = state["numpy_rng"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path / STATE}: inconsistent contents ({type(exc).__name__})") from None
    verify(path, [WEIGHTS, RNG], files)
    weights = _load_tensors(path / WEIGHTS)
    _require_finite(path / WEIGHTS, weights)
    try:
        params = [weights[f"p{i}"] for i in range(len(weights))]
    except KeyError:
        raise CheckpointError(
            f"{path / WEIGHTS}: parameters are not numbered p0 … p{len(weights) - 1}"
        ) from None
    rng = _load_tensors(path / RNG)
    try:
        numpy_rng = (
            kind,
            rng["numpy_key"].numpy().astype(np.uint32),
            int(pos),
            int(has_gauss),
            float(cached),
        )
        torch_rng = rng["torch"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path / RNG}: inconsistent contents ({type(exc).__name__})") from None
    optimizer, distributed = (
        ({}, frozenset()) if sharded else read_optimizer(path, optimizer_stem(False, 0), files)
    )
    return CheckpointState(step, params, optimizer, torch_rng, numpy_rng, path, distributed, sharded, files)


def read_optimizer(
    path: Path, stem: str, files: dict[str, Any]
) -> tuple[dict[str, Any], frozenset[tuple[int, str]]]:
    """Verify (against the manifest entries ``files``) and decode ``<stem>.safetensors`` + ``<stem>.json``:
    an optimizer state_dict and the entries that were DTensor shards."""
    verify(path, [f"{stem}.{x}" for x in EXTS], files)
    tensors = _load_tensors(path / f"{stem}.safetensors")
    _require_finite(path / f"{stem}.safetensors", tensors)
    doc = _load_json(path / f"{stem}.json")
    try:
        optimizer = {
            "param_groups": [_groups_from_json(g) for g in doc["param_groups"]],
            "state": {
                int(index): {
                    name: tensors[v["tensor"]] if "tensor" in v else v["value"] for name, v in entry.items()
                }
                for index, entry in doc["state"].items()
            },
        }
        distributed = frozenset(
            (int(index), name)
            for index, entry in doc["state"].items()
            for name, v in entry.items()
            if v.get("dtensor")
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(
            f"{path / stem}.json: inconsistent contents ({type(exc).__name__}: {exc})"
        ) from None
    return optimizer, distributed


def _groups_from_json(group: dict[str, Any]) -> dict[str, Any]:
    """JSON turned tuples (AdamW's betas) into lists; the optimizer saved them as tuples."""
    return {k: (tuple(v) if isinstance(v, list) and k != "params" else v) for k, v in group.items()}


def _same(value: Any) -> Any:
    return value


def load_latest(
    folder: Path,
    rank: int = 0,
    gather: Gather = _alone,
    broadcast: Callable[[Any], Any] = _same,
    run_uid: str | None = None,
    max_step: int | None = None,
) -> CheckpointState | None:
    """The newest checkpoint every rank can read, or None when the run never wrote one.

    Rank 0 reads and verifies the candidates in ``folder`` (its machine's), newest first, and ``broadcast``s
    the first intact one (ranks on other machines cannot read its disk); under FSDP each rank then verifies
    and reads its own optimizer shard from its machine's ``folder`` against rank 0's manifest, and the ranks
    agree (``gather``): a shard refused on any rank makes every rank move on to the next older checkpoint.
    Each refusal is logged in one line naming the file, and so is the fallback. Raises
    :class:`CheckpointError` when checkpoints exist and none is intact (the history is then left as it is
    rather than restarted from scratch). ``run_uid`` and ``max_step`` (rank 0's) refuse checkpoints of other
    runs and checkpoints ahead of the run's logged steps, like any other refused checkpoint."""
    folder = Path(folder)
    main = rank == 0
    refused: list[str] = []
    candidates: list[Path] = []
    if main:
        candidates = list_checkpoints(folder)[::-1]
        legacy = sorted(folder.glob("step_*.pt")) if folder.is_dir() else []
        refused = [
            f"{p}: pickle checkpoint of an older version, not loaded (it could run code)" for p in legacy
        ]
        for message in refused:
            log.warning("checkpoint refused: %s", message)
    tried = 0
    while True:
        found = None
        while main and found is None and tried < len(candidates):
            tried += 1
            try:
                found = read_main(candidates[tried - 1], run_uid)
                if max_step is not None and found.step > max_step:
                    path, step = found.path, found.step
                    found = None
                    raise CheckpointError(
                        f"{path}: step {step} is past the run's last logged step {max_step}"
                    )
            except CheckpointError as exc:
                log.warning("checkpoint refused: %s", exc)
                refused.append(str(exc))
        state, first_refusal = broadcast((found, refused[0] if refused else None))
        if state is None:
            if first_refusal is not None:
                raise CheckpointError(f"resume: no intact checkpoint in {folder} (refused: {first_refusal})")
            return None
        state.path = folder / state.path.name
        message = ""
        if state.sharded:
            try:
                state.optimizer, state.distributed = read_optimizer(
                    state.path, optimizer_stem(True, rank), state.files
                )
            except CheckpointError as exc:
                message = str(exc)
        failed = next((m for m in gather(message) if m), "")
        if failed:
            if main:
                log.warning("checkpoint refused: %s", failed)
                refused.append(failed)
            continue
        if main and (tried > 1 or refused):
            log.warning("resuming from %s, the newest intact checkpoint", state.path)
        return state


def restore(
    state: CheckpointState, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, sharded: bool
) -> None:
    """Load ``state`` into the trainable ``params`` (each cast to its parameter's device and dtype, distributed
    like a DTensor parameter), the ``optimizer`` (``sharded``, under FSDP: this rank's shards of its state back
    into DTensors placed like their parameters) and the torch and NumPy RNG states. The caller has checked that
    the shapes match."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        for p, saved in zip(params, state.params):
            saved = saved.to(p.device, p.dtype)
            if isinstance(p, DTensor):
                saved = distribute_tensor(saved, p.device_mesh, p.placements)
            p.copy_(saved)
    optim = state.optimizer
    if sharded:  # this rank's shards back into DTensors placed like their parameters
        for index, name in state.distributed:
            p = params[index]
            optim["state"][index][name] = DTensor.from_local(
                optim["state"][index][name].to(p.device),
                p.device_mesh,
                p.placements,
                shape=p.shape,
                stride=p.stride(),
            )
    optimizer.load_state_dict(optim)
    torch.set_rng_state(state.torch_rng)
    np.random.set_state(state.numpy_rng)

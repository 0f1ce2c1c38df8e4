"""jagg_engine/train/checkpoint.py on real files: exact round trip, a flipped byte, a truncated file, a pickle
with a payload, non-finite values, pruning, per-rank shards, and a full disk (a small tmpfs)."""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from jagg_engine.errors import DiskFullError
from jagg_engine.train import checkpoint


def _model_and_optimizer(seed: int = 0, width: int = 64):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer


def _train(model, optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(8, model[0].in_features)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _save(folder: Path, step: int, model, optimizer, **kwargs) -> Path:
    return checkpoint.save(
        folder, step, [p.detach() for p in model.parameters()], optimizer.state_dict(), **kwargs
    )


def _restore(state: checkpoint.CheckpointState, model, optimizer) -> None:
    with torch.no_grad():
        for p, saved in zip(model.parameters(), state.params):
            p.copy_(saved)
    optimizer.load_state_dict(state.optimizer)
    torch.set_rng_state(state.torch_rng)
    np.random.set_state(state.numpy_rng)


def _flip(path: Path, offset: int, length: int = 4096) -> None:
    """XOR ``length`` bytes of ``path`` from ``offset`` with 0xFF (a real bit-rot of a 4 KB block)."""
    with path.open("r+b") as fh:
        fh.seek(offset)
        block = fh.read(length)
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in block))


def _tensor_offset(path: Path, key: str) -> int:
    """Absolute byte offset of tensor ``key``'s data in a safetensors file."""
    raw = path.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    return 8 + header_len + header[key]["data_offsets"][0]


def test_round_trip_is_exact_and_training_continues_bit_identically(tmp_path):
    model, optimizer = _model_and_optimizer()
    _train(model, optimizer, 3)
    np.random.seed(5)
    path = _save(tmp_path, 3, model, optimizer)
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json", "optimizer.json", "optimizer.safetensors", "rng.safetensors", "state.json",
        "weights.safetensors",
    ]  # fmt: skip
    _train(model, optimizer, 2)
    expected = [p.detach().clone() for p in model.parameters()]
    expected_np = np.random.rand(3)

    fresh, fresh_opt = _model_and_optimizer(seed=1)
    state = checkpoint.load_latest(tmp_path)
    assert state.step == 3 and state.path == path
    _restore(state, fresh, fresh_opt)
    _train(fresh, fresh_opt, 2)
    for a, b in zip(expected, fresh.parameters()):
        assert torch.equal(a, b)  # bit-identical, not close
    assert np.array_equal(np.random.rand(3), expected_np)
    assert fresh_opt.state_dict()["param_groups"][0]["betas"] == (0.9, 0.999)


def test_a_flipped_block_is_refused_in_one_line_and_resume_falls_back(tmp_path, caplog):
    model, optimizer = _model_and_optimizer()
    _train(model, optimizer, 1)
    _save(tmp_path, 1, model, optimizer)
    _train(model, optimizer, 1)
    newest = _save(tmp_path, 2, model, optimizer)
    weights = newest / checkpoint.WEIGHTS
    _flip(weights, _tensor_offset(weights, "p0") + 128)  # inside the first layer's weight (16 KB)
    with caplog.at_level(logging.WARNING, logger="jagg.train"):
        state = checkpoint.load_latest(tmp_path)
    assert state.step == 1
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused == [f"checkpoint refused: {weights}: sha256 does not match the manifest (corrupt)"]
    assert any(f"resuming from {tmp_path / 'step_00001'}" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("optimizer.safetensors", "bytes, the manifest says"),
        ("manifest.json", "manifest.json: unreadable"),
        ("state.json", "bytes, the manifest says"),
    ],
)
def test_a_truncated_file_is_refused_naming_it(tmp_path, name, message):
    model, optimizer = _model_and_optimizer()
    _save(tmp_path, 1, model, optimizer)
    newest = _save(tmp_path, 2, model, optimizer)
    target = newest / name
    os.truncate(target, target.stat().st_size // 2)
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.read(newest)
    assert str(target) in str(err.value) and message in str(err.value) and "\n" not in str(err.value)
    assert checkpoint.load_latest(tmp_path).step == 1


def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    model, optimizer = _model_and_optimizer()
    only = _save(tmp_path, 4, model, optimizer)
    (only / checkpoint.MANIFEST).unlink()  # a write that never finished
    with pytest.raises(
        checkpoint.CheckpointError, match=r"resume: no intact checkpoint in .*manifest.json: missing"
    ):
        checkpoint.load_latest(tmp_path)
    assert checkpoint.load_latest(tmp_path / "never-written") is None


class _Payload:
    """Unpickling this makes a folder: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_pickle_with_a_payload_is_never_run(tmp_path):
    marker = tmp_path / "payload-ran"
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    # 1. a pickle checkpoint of the older format, and one in the new layout's name
    torch.save({"step": 9, "params": [_Payload(marker)]}, folder / "step_00009.pt")
    model, optimizer = _model_and_optimizer()
    forged = _save(folder, 10, model, optimizer)
    (forged / checkpoint.WEIGHTS).write_bytes(pickle.dumps(_Payload(marker)))
    # 2. the forger rewrites the manifest so that sizes and hashes match the payload
    manifest = json.loads((forged / checkpoint.MANIFEST).read_text())
    manifest["files"][checkpoint.WEIGHTS] = {
        "bytes": (forged / checkpoint.WEIGHTS).stat().st_size,
        "sha256": checkpoint.sha256(forged / checkpoint.WEIGHTS),
    }
    (forged / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.load_latest(folder)
    assert "step_00009.pt: pickle checkpoint of an older version, not loaded" in str(err.value)
    with pytest.raises(checkpoint.CheckpointError, match="weights.safetensors: unreadable safetensors"):
        checkpoint.read(forged)
    assert not marker.exists()


def test_the_package_never_unpickles_without_weights_only():
    """Nothing the project loads can run code: every torch.load passes weights_only=True; no pickle.load."""
    root = Path(__file__).resolve().parents[1]
    for path in [*root.glob("jagg_engine/**/*.py"), *root.glob("app/*.py"), *root.glob("scripts/**/*.py")]:
        text = path.read_text(encoding="utf-8")
        assert "pickle.load" not in text and "weights_only=False" not in text, path
        for chunk in text.split("torch.load(")[1:]:
            assert "weights_only=True" in chunk.split(")")[0], path


def _forge(path: Path, name: str, tensors: dict[str, torch.Tensor]) -> None:
    """Rewrite ``name`` of checkpoint ``path`` with ``tensors`` and its manifest entry to match (a checkpoint
    written by an older version, which saved whatever it had): the file is intact, the values are not."""
    from safetensors.torch import save_file

    save_file(tensors, str(path / name))
    manifest = json.loads((path / checkpoint.MANIFEST).read_text())
    manifest["files"][name] = {
        "bytes": (path / name).stat().st_size,
        "sha256": checkpoint.sha256(path / name),
    }
    (path / checkpoint.MANIFEST).write_text(json.dumps(manifest))


def test_non_finite_parameters_or_optimizer_state_are_refused(tmp_path):
    from safetensors.torch import load_file

    model, optimizer = _model_and_optimizer()
    _train(model, optimizer, 1)
    _save(tmp_path, 1, model, optimizer, keep=5)
    bad = _save(tmp_path, 2, model, optimizer, keep=5)
    weights = load_file(str(bad / checkpoint.WEIGHTS))
    weights["p1"][3] = float("nan")
    _forge(bad, checkpoint.WEIGHTS, weights)
    with pytest.raises(
        checkpoint.CheckpointError, match=r"weights.safetensors: tensor 'p1' has non-finite values"
    ):
        checkpoint.read(bad)
    bad = _save(tmp_path, 3, model, optimizer, keep=5)
    moments = load_file(str(bad / "optimizer.safetensors"))
    moments["2/exp_avg_sq"][0] = float("inf")
    _forge(bad, "optimizer.safetensors", moments)
    with pytest.raises(
        checkpoint.CheckpointError, match=r"optimizer.safetensors: tensor '2/exp_avg_sq' has non"
    ):
        checkpoint.read(bad)
    assert checkpoint.load_latest(tmp_path).step == 1


def test_a_non_finite_checkpoint_is_never_written(tmp_path):
    """NaN weights or an inf optimizer moment: save refuses in one line and leaves no folder, not even a
    partial one; the checkpoints before stay."""
    model, optimizer = _model_and_optimizer()
    _train(model, optimizer, 1)
    _save(tmp_path, 1, model, optimizer, keep=5)
    with torch.no_grad():
        model[0].bias[3] = float("nan")
    with pytest.raises(
        checkpoint.CheckpointError, match=r"^checkpoint of step 2 not written: weights 'p1' has"
    ):
        _save(tmp_path, 2, model, optimizer, keep=5)
    with torch.no_grad():
        model[0].bias[3] = 0.0
    state = optimizer.state_dict()
    state["state"][2]["exp_avg_sq"][0] = float("inf")
    with pytest.raises(checkpoint.CheckpointError, match=r"optimizer state '2/exp_avg_sq' has non-finite"):
        checkpoint.save(tmp_path, 3, [p.detach() for p in model.parameters()], state, keep=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00001"]


def test_a_checkpoint_of_another_run_or_ahead_of_the_history_is_refused(tmp_path, caplog):
    """The manifest names its run's uid: another run (or a run asking for its own uid of a checkpoint that
    names none) refuses it, and so does a run whose logged steps end before the checkpoint's step."""
    model, optimizer = _model_and_optimizer()
    _save(tmp_path, 1, model, optimizer, keep=5, run_uid="a" * 32)
    _save(tmp_path, 2, model, optimizer, keep=5, run_uid="a" * 32)
    _save(tmp_path, 3, model, optimizer, keep=5, run_uid="b" * 32)
    with caplog.at_level(logging.WARNING, logger="jagg.train"):
        assert checkpoint.load_latest(tmp_path, run_uid="a" * 32).step == 2
    assert f"step_00003: belongs to run {'b' * 32}, not to this run ({'a' * 32})" in caplog.text
    assert checkpoint.load_latest(tmp_path, run_uid="a" * 32, max_step=1).step == 1
    assert "step_00002: step 2 is past the run's last logged step 1" in caplog.text
    with pytest.raises(checkpoint.CheckpointError, match="no intact checkpoint"):
        checkpoint.load_latest(tmp_path, run_uid="c" * 32)
    unnamed = tmp_path / "unnamed"
    _save(unnamed, 1, model, optimizer)
    with pytest.raises(checkpoint.CheckpointError, match="belongs to no run"):
        checkpoint.load_latest(unnamed, run_uid="a" * 32)


def test_keep_prunes_older_checkpoints_and_leftover_partials(tmp_path):
    model, optimizer = _model_and_optimizer()
    (tmp_path / ".step_00002.partial").mkdir(parents=True)  # a process killed while writing
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, model, optimizer, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00003", "step_00004"]
    _save(tmp_path, 4, model, optimizer, keep=3)  # the same step again replaces it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00003", "step_00004"]
    assert checkpoint.load_latest(tmp_path).step == 4


def _two_ranks(work):
    """Run ``work(rank, gather)`` on two threads that agree through ``gather`` like two processes."""
    barrier, slots, results, errors = threading.Barrier(2), [None, None], [None, None], [None, None]

    def gather_for(rank):
        def gather(value):
            slots[rank] = value
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out

        return gather

    def target(rank):
        try:
            results[rank] = work(rank, gather_for(rank))
        except Exception as exc:  # noqa: BLE001
            errors[rank] = exc

    threads = [threading.Thread(target=target, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


def test_per_rank_optimizer_shards_are_in_the_manifest_and_verified(tmp_path):
    models = [_model_and_optimizer(seed=r) for r in (0, 1)]  # each rank's own optimizer state (FSDP shards)
    for m, o in models:
        _train(m, o, 1)

    def save(step):
        return lambda rank, gather: _save(
            tmp_path, step, *models[rank], rank=rank, world=2, sharded=True, gather=gather
        )

    _two_ranks(save(1))
    results, errors = _two_ranks(save(2))
    assert errors == [None, None] and results[1] is None
    files = checkpoint.read_manifest(results[0])["files"]
    assert {"optimizer_rank0.safetensors", "optimizer_rank1.safetensors", "optimizer_rank1.json"} <= set(
        files
    )
    assert "optimizer.safetensors" not in files
    state = checkpoint.read(results[0], rank=1)
    assert torch.equal(
        state.optimizer["state"][0]["exp_avg"], models[1][1].state_dict()["state"][0]["exp_avg"]
    )

    shard = results[0] / "optimizer_rank1.safetensors"
    _flip(shard, _tensor_offset(shard, "0/exp_avg"), 64)  # corrupt on rank 1 only: both ranks fall back
    loaded, errors = _two_ranks(
        lambda rank, gather: checkpoint.load_latest(
            tmp_path, rank, gather, broadcast=lambda v: copy.deepcopy(gather(v)[0])
        )
    )
    assert errors == [None, None] and [s.step for s in loaded] == [1, 1]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs (a real full disk); skipped only where mounting is not permitted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_fails_the_write_and_leaves_no_partial_file(small_tmpfs):
    model, optimizer = _model_and_optimizer(width=256)  # ~0.26 MB of weights, 0.5 MB of optimizer state
    _train(model, optimizer, 1)
    _save(small_tmpfs, 1, model, optimizer)
    big, big_opt = _model_and_optimizer(width=512)  # ~1 MB + 2 MB: does not fit beside the first
    _train(big, big_opt, 1)
    with pytest.raises(DiskFullError) as err:
        _save(small_tmpfs, 2, big, big_opt)
    assert str(err.value).startswith(f"disk full: {small_tmpfs / '.step_00002.partial'}/")
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["step_00001"]  # no .partial, no .tmp
    assert checkpoint.load_latest(small_tmpfs).step == 1  # the older checkpoint is intact


def test_safetensors_files_hold_tensors_only(tmp_path):
    """A weights file is plain safetensors: other tools read it without this package."""
    model, optimizer = _model_and_optimizer()
    path = _save(tmp_path, 1, model, optimizer)
    from safetensors import safe_open

    with safe_open(str(path / checkpoint.WEIGHTS), framework="pt") as fh:
        assert sorted(fh.keys(), key=lambda k: int(k[1:])) == [f"p{i}" for i in range(4)]


def test_shards_of_another_machine_stay_there_and_are_checked_against_rank_0s_manifest(tmp_path):
    """Two machines (two folders): rank 1's shard is written and committed in its machine's folder, its hash
    is in rank 0's manifest, rank 0 sends the rest of the checkpoint, and a corrupt remote shard is refused."""
    folders = [tmp_path / "machine0", tmp_path / "machine1"]
    models = [_model_and_optimizer(seed=r) for r in (0, 1)]

    def save(step):
        return lambda rank, gather: _save(
            folders[rank],
            step,
            *models[rank],
            rank=rank,
            world=2,
            sharded=True,
            gather=gather,
            local_main=True,
        )

    for step in (1, 2):
        for m, o in models:
            _train(m, o, 1)
        results, errors = _two_ranks(save(step))
        assert errors == [None, None]
    assert sorted(p.name for p in (folders[1] / "step_00002").iterdir()) == [
        "optimizer_rank1.json",
        "optimizer_rank1.safetensors",
    ]
    assert "optimizer_rank1.safetensors" in checkpoint.read_manifest(folders[0] / "step_00002")["files"]

    def load(rank, gather):
        return checkpoint.load_latest(
            folders[rank], rank, gather, broadcast=lambda v: copy.deepcopy(gather(v)[0])
        )

    loaded, errors = _two_ranks(load)
    assert errors == [None, None] and [s.step for s in loaded] == [2, 2]
    assert torch.equal(loaded[1].params[0], loaded[0].params[0])  # rank 0's weights reached rank 1
    expected = models[1][1].state_dict()["state"][0]["exp_avg"]
    assert torch.equal(loaded[1].optimizer["state"][0]["exp_avg"], expected)

    shard = folders[1] / "step_00002" / "optimizer_rank1.safetensors"
    _flip(shard, _tensor_offset(shard, "0/exp_avg"), 64)
    loaded, errors = _two_ranks(load)
    assert errors == [None, None] and [s.step for s in loaded] == [1, 1]

"""scripts/gpu_check.py on the CPU: --help, the published configs' sizes, and the whole script at a tiny size."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_help_runs_on_the_cpu():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "--micro-batches" in proc.stdout and "--depth" in proc.stdout and "--out" in proc.stdout


def test_no_gpu_is_one_clear_error(gpu_check, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as exc:
        gpu_check.parse_args([])
    assert exc.value.code == 2 and "device: no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, params",
    [("flux-dev", 11_901_408_320), ("sd3.5-medium", 2_243_171_520)],
)
def test_published_configs_build_at_full_size_on_the_meta_device(gpu_check, name, params):
    """The whole published architecture (no memory on the meta device): FLUX.1-dev's 11.9 B parameters."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    cls = FluxTransformer2DModel if name == "flux-dev" else SD3Transformer2DModel
    with torch.device("meta"):
        model = cls(**gpu_check.published_config(name))
    assert sum(p.numel() for p in model.parameters()) == params
    shallow = gpu_check.published_config(name, depth=2)
    assert shallow["num_layers"] == 2
    if name == "flux-dev":
        assert shallow["num_single_layers"] == 4  # the published 19 : 38
    else:
        assert shallow["dual_attention_layers"] == (0, 1)


@pytest.mark.slow
def test_the_whole_check_runs_tiny_on_the_cpu(gpu_check, tmp_path):
    """Both models at depth 1, 2 heads, 32 px: measurement for two micro-batches, two training steps, JSON."""
    argv = [
        "--device", "cpu", "--depth", "1", "--heads", "2", "--resolution", "32", "--text-len", "4",
        "--batch", "2", "--micro-batches", "1,2", "--window", "3", "--repeats", "1",
        "--train-steps", "2", "--train-batch", "4", "--group-size", "2", "--out", str(tmp_path),
    ]  # fmt: skip
    assert gpu_check.main(argv) == 0
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["status"] == "complete" and report["dtype"] == "float32"
    assert set(report["models"]) == {"flux-dev", "sd3.5-medium"}
    for entry in report["models"].values():
        assert entry["config"]["num_layers"] == 1 and entry["config"]["num_attention_heads"] == 2
        assert 0 < entry["trainable_params"] < entry["params"]  # LoRA only
        assert [m["micro_batch"] for m in entry["measure"]] == [1, 2]
        for m in entry["measure"]:
            assert set(m["strategies"]) == {"exact", "jagg", "jagg+reuse"} and m["r"] > 0
            for row in m["strategies"].values():
                assert row["median_s_per_group"] > 0 and row["predicted_speedup"] > 0
                assert row["peak_saved_activation_bytes"] > 0
            jagg = m["strategies"]["jagg"]["counts"]
            # W = 3, one group, 2 samples in micro-batches of b: per micro-batch 1 batched grad forward, 1 inner
            assert jagg["forward_grad"] == 2 // m["micro_batch"] and jagg["backward"] == 2 // m["micro_batch"]
            assert m["strategies"]["jagg+reuse"]["counts"]["reused"] == 2 // m["micro_batch"]
        assert [row["step"] for row in entry["train"]] == [1, 2]
        for row in entry["train"]:
            assert torch.isfinite(torch.tensor([row["reward_mean"], row["loss"], row["grad_norm"]])).all()
            assert row["reused"] > 0  # on-policy: the inner step's velocity comes from the rollout
        # the windowed variant: W = 3 sliding over T = 7 (starts 0 … 2), prefix once per group of 2, 2 dpmpp-2m
        # steps after the window
        windowed = entry["train_windowed"]
        assert [row["window"] for row in windowed] == [[0, 3], [1, 4]]
        assert [row["sampling_forward"] for row in windowed] == [0 + 3 + 2, 1 / 2 + 3 + 2]
        assert all(row["reused"] > 0 and math.isfinite(row["loss"]) for row in windowed)

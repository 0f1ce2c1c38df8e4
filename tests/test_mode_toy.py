"""`mode-toy`: the prompt-conditioned MLP flow the plateau reproduction runs on, and its reward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jagg_engine.backbones import BackboneConfigError, build_backbone
from jagg_engine.backbones import mode_toy as mt
from jagg_engine.rewards.registry import RewardConfigError, build_reward, check_reward
from jagg_engine.store import open_store
from jagg_engine.train.config import load_config
from jagg_engine.train.trainer import Trainer

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "mode-toy.yaml"


def ode_samples(model: mt.ModeToy, prompts: list[str], steps: int = 12, seed: int = 0) -> torch.Tensor:
    cond = model.encode_prompts(prompts)
    z = torch.randn(len(prompts), mt.DIM, generator=torch.Generator().manual_seed(seed))
    ts = torch.linspace(1, 0, steps + 1)
    with torch.no_grad():
        for i in range(steps):
            z = z + (ts[i + 1] - ts[i]) * model(z, ts[i].expand(len(prompts)), cond)
    return z


def test_fixed_point_strip_round_trips_and_refuses_other_images():
    x = torch.randn(64, mt.DIM, generator=torch.Generator().manual_seed(0)).clamp(-3, 3) * 2.5
    img = mt.encode_points(x)
    assert img.shape == (64, 1, mt.DIM, 3) and img.dtype == torch.uint8
    assert (mt.decode_points(img) - x).abs().max() <= 16 / 65536
    with pytest.raises(ValueError, match=r"mode-toy: expected \(B, 1, 8, 3\) uint8"):
        mt.decode_points(torch.zeros(2, 32, 32, 3, dtype=torch.uint8))


def test_shipped_model_draws_every_mode_at_its_width():
    model = build_backbone("mode-toy")
    prompts = model.sample_prompts(2048, seed=1)
    z = ode_samples(model, prompts)
    d = (z[:, None] - mt.centres()[mt.prompt_index(prompts)]).norm(dim=-1)  # (n, modes)
    share = torch.bincount(d.argmin(1), minlength=mt.NUM_MODES).float() / len(prompts)
    assert share.min() > 0.19 and share.max() < 0.31, share
    width = d.min(1).values.mean().item()  # E|x - mu| for N(mu, 0.3^2 I_8) is 0.3 * 2.74
    assert 0.7 < width < 1.05, width


def test_reward_scores_mode_zero_and_precision():
    reward = build_reward("mode-toy")
    prompts = ["mode-toy 3", "mode-toy 3", "mode-toy 3"]
    c = mt.centres()[3]
    x = torch.stack([c[0], c[0] + 0.5 / mt.DIM**0.5, c[1]])
    r = reward(mt.encode_points(x), prompts)
    assert r[0] == pytest.approx(1.0, abs=1e-3)
    assert r[1] == pytest.approx(float(torch.exp(torch.tensor(-0.5))), abs=2e-3)  # |d| = 0.5 = tau
    assert r[2] < 0.01  # another mode of the same prompt
    with pytest.raises(ValueError, match="mode-toy: unknown prompt 'a red circle'"):
        reward(mt.encode_points(x[:1]), ["a red circle"])
    with pytest.raises(RewardConfigError, match="reward.tau: must be a number > 0"):
        check_reward("mode-toy", tau=0)


def test_missing_weights_are_named(tmp_path):
    with pytest.raises(BackboneConfigError, match="mode-toy: missing weights .*nothing.pt"):
        build_backbone("mode-toy", weights=str(tmp_path / "nothing.pt"))


def test_exact_grpo_on_mode_toy_raises_the_eval_reward(tmp_path):
    """The reproduction's config learns: 40 exact steps lift the eval reward well above the base model's."""
    torch.set_num_threads(1)
    cfg = load_config(str(CONFIG), ["strategy=exact", "steps=40", "eval_every=40"], check_environment=False)
    store = open_store(tmp_path)
    run_id = store.create_run(cfg.name, cfg.to_dict(), tmp_path / "run")
    Trainer(cfg, run_id, str(tmp_path), run_dir=tmp_path / "run").run()
    evals = store.metric_series(run_id, ["eval/reward/mean"]).dropna()
    start, end = evals["eval/reward/mean"].iloc[0], evals["eval/reward/mean"].iloc[-1]
    assert start == pytest.approx(0.0946, abs=0.01)
    assert end > start + 0.08, (start, end)

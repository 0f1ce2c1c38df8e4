"""precision: bf16 — bf16 compute over float32 master weights, for full fine-tuning and LoRA: the optimizer holds
float32 tensors, the transformer's matmuls run in bf16, and an update of 1e-4·|w| a step (far below bf16's
2⁻⁸ ≈ 3.9e-3 resolution) survives 100 steps as it does in an all-float32 run."""

from __future__ import annotations

import pytest
import torch
from test_backbones_diffusers import save_tiny_flux  # noqa: I001

from jagg_engine.jagg import policy_update
from jagg_engine.store import open_store
from jagg_engine.train.config import load_config
from jagg_engine.train.trainer import Trainer

STEPS, RATE = 100, 1e-4  # lr · weight_decay = RATE: AdamW's decoupled decay moves w by RATE·|w| a step


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tiny-flux-bf16"))
    save_tiny_flux(folder)
    return folder


def make_trainer(tmp_path, flux_dir, precision, lora_rank):
    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\ntwo blue dogs\n")
    cfg = load_config(
        None,
        [
            "backbone=flux",
            f"model_path={flux_dir}",
            f"prompts_file={prompts}",
            "rewards={brightness: 1.0}",
            f"precision={precision}",
            f"lora_rank={lora_rank}",
            "backbone_options={resolution: 8, max_sequence_length: 6}",
            "sampling_steps=4",
            "sde_window_end=null",
            "sde_window_schedule=fixed",  # every step trained (the test takes W = 4 over all of them)
            "window=2",
            "eval_num_prompts=2",
            "grad_clip=null",
            "lr=1e-2",
            f"weight_decay={RATE / 1e-2}",
        ],
        check_environment=False,
    )
    store = open_store(tmp_path)
    run_id = store.create_run(cfg.name, cfg.to_dict(), tmp_path / "run")
    return Trainer(cfg, run_id, str(tmp_path))


def decay_steps(trainer):
    """STEPS optimizer steps through the trainer's own optimize(), with zero gradients: only the decoupled
    weight decay moves the weights, by RATE·|w| a step. Returns the relative change of every trained weight."""
    start = [p.detach().double().clone() for p in trainer.params]
    for step in range(1, STEPS + 1):
        for p in trainer.params:
            p.grad = torch.zeros_like(p)
        trainer.optimize(step)
    return torch.cat([((p.detach().double() - w) / w)[w != 0] for p, w in zip(trainer.params, start)])


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_bf16_keeps_fp32_masters_and_small_updates_survive(tmp_path, flux_dir, lora_rank):
    mixed = make_trainer(tmp_path / "bf16", flux_dir, "bf16", lora_rank)
    # the optimizer steps float32 masters
    held = [p for group in mixed.optimizer.param_groups for p in group["params"]]
    assert held and all(p.dtype == torch.float32 for p in held)
    if lora_rank:  # the frozen base weights stay in bf16
        frozen = [p for p in mixed.model.transformer.parameters() if not p.requires_grad]
        assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    # the forward computes in bf16: a transformer projection's output under the backbone's autocast
    seen = []
    proj = mixed.model.transformer.transformer_blocks[0].attn.to_q
    handle = proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    z = torch.randn(2, *mixed.model.latent_shape)
    v = mixed.model(z, torch.tensor([0.9, 0.4]), mixed.model.encode_prompts(["a red cat", "two blue dogs"]))
    handle.remove()
    assert seen == [torch.bfloat16] and v.dtype == torch.float32

    expected = (1 - RATE) ** STEPS - 1  # ≈ −0.995 %
    change_bf16 = decay_steps(mixed)
    change_fp32 = decay_steps(make_trainer(tmp_path / "fp32", flux_dir, "fp32", lora_rank))
    assert change_fp32.sub(expected).abs().max() < 1e-5
    assert change_bf16.sub(expected).abs().max() < 1e-5  # measured against the float32 run: the same change
    assert (change_bf16.mean() / change_fp32.mean()).item() == pytest.approx(1.0, abs=1e-4)


def test_without_masters_the_same_updates_vanish():
    """What the masters prevent: bf16 weights stepped directly keep none of the 100 updates."""
    w = torch.nn.Parameter(torch.randn(1000, dtype=torch.bfloat16))
    start = w.detach().clone()
    optimizer = torch.optim.AdamW([w], lr=1e-2, weight_decay=RATE / 1e-2)
    for _ in range(STEPS):
        w.grad = torch.zeros_like(w)
        optimizer.step()
    assert torch.equal(w.detach(), start)


def test_bf16_lora_flux_reuses_rollout_velocities_exactly(tmp_path, flux_dir):
    """The reuse guard on a real peft-LoRA diffusers backbone under bf16 autocast: the unchanged sampling policy
    reuses (its plain settings and hashes are stable across forwards), and the gradient is the no-reuse one."""
    trainer = make_trainer(tmp_path, flux_dir, "bf16", 4)
    with torch.no_grad():
        for (
            p
        ) in trainer.params:  # a trained adapter: B = 0 at init would make every LoRA gradient path trivial
            p.add_(0.05 * torch.randn_like(p))
    trainer.update = trainer.cfg.apply_overrides(["window=4"]).update_config()
    prompts, groups = trainer.step_prompts(1)
    traj = trainer.sample(1, prompts)
    adv = torch.linspace(-1, 1, traj.batch_size)
    grads = {}
    for mode in ("auto", "off"):
        for p in trainer.params:
            p.grad = None
        update = trainer.update.__class__(**{**trainer.update.__dict__, "reuse_rollout_velocity": mode})
        result = policy_update(trainer.model, traj, adv, update, trainer.sampler)
        assert result.counts.reused == (2 if mode == "auto" else 0)
        grads[mode] = torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None])
    assert torch.equal(grads["auto"], grads["off"])

"""`jagg export-model` round trips on tiny pipelines built offline: a run trains one LoRA (or full) step on tiny
FLUX, SD3 and Qwen-Image, is exported, and a fresh diffusers pipeline loads the export with diffusers' own
loaders (``load_lora_weights``, ``from_pretrained``); its transformer must give the trained policy's velocity.
The export also loads back through the engine (``lora_path``, ``model_path=DIR``)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from test_backbones_diffusers import (  # noqa: I001
    PROMPTS,
    save_tiny_flux,
    save_tiny_qwen_image,
    save_tiny_sd3,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from jagg_engine.backbones import build_backbone  # noqa: E402
from jagg_engine.export import build_model, export_model  # noqa: E402
from jagg_engine.export_format import INFO, LORA_WEIGHTS  # noqa: E402
from jagg_engine.store import open_store  # noqa: E402
from jagg_engine.train.config import load_config  # noqa: E402
from jagg_engine.train.trainer import Trainer  # noqa: E402

PIPELINES = {
    "flux": (
        "FluxPipeline",
        "FluxTransformer2DModel",
        save_tiny_flux,
        "{resolution: 8, max_sequence_length: 6}",
    ),
    "sd3": (
        "StableDiffusion3Pipeline",
        "SD3Transformer2DModel",
        save_tiny_sd3,
        "{resolution: 8, max_sequence_length: 6}",
    ),
    "qwen-image": (
        "QwenImagePipeline",
        "QwenImageTransformer2DModel",
        save_tiny_qwen_image,
        "{resolution: 8}",
    ),
}
ONE_STEP = [
    "steps=1",
    "prompts_per_step=2",
    "group_size=2",
    "sampling_steps=4",
    "sde_window_end=null",
    "sde_window_schedule=fixed",
    "window=2",
    "eval_num_prompts=2",
    "eval_seeds=[0]",
    "eval_every=1",
    "sample_every=0",
    "rewards={brightness: 1.0}",
    "lr=1e-2",  # one step moves the weights visibly
    "clip_range=0.2",
]


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = {}
    for name, (_, _, save, _) in PIPELINES.items():
        folder = tmp_path_factory.mktemp(f"base-{name}")
        save(str(folder))
        out[name] = str(folder)
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("a red cat\ntwo blue dogs\n")
    out["prompts"] = str(prompts)
    return out


def train_one_step(runs: Path, bases: dict[str, str], backbone: str, *extra: str) -> Trainer:
    """One training step of a run in ``runs`` (its history, eval and final checkpoint, as `jagg train`)."""
    cfg = load_config(
        None,
        [
            *ONE_STEP,
            f"backbone={backbone}",
            f"model_path={bases[backbone]}",
            f"prompts_file={bases['prompts']}",
            f"backbone_options={PIPELINES[backbone][3]}",
            *extra,
        ],
        check_environment=False,
    )
    run_id = open_store(runs).create_run(cfg.name, cfg.to_dict(), runs / "run-0001")
    trainer = Trainer(cfg, run_id, str(runs))
    assert trainer.run() == "finished"
    return trainer


def fixed_inputs(model):
    g = torch.Generator().manual_seed(5)
    z = torch.randn(2, *model.latent_shape, generator=g)  # (B, *latent_shape)
    return z, torch.tensor([0.8, 0.3]), model.encode_prompts(PROMPTS)


def velocity_with(model, transformer, inputs) -> torch.Tensor:
    """The backbone's velocity call with another transformer (a fresh pipeline's) in place of its own."""
    z, t, cond = inputs
    with torch.no_grad():
        return model.velocity(transformer, z, t, cond).float()


def fresh_pipeline(backbone: str, base: str, **kwargs):
    import diffusers

    return getattr(diffusers, PIPELINES[backbone][0]).from_pretrained(base, **kwargs)


@pytest.mark.parametrize("backbone", ["flux", "sd3", "qwen-image"])
def test_lora_export_loads_in_diffusers_and_back(tmp_path: Path, bases, backbone: str) -> None:
    runs = tmp_path / "runs"  # the export goes beside the runs folder, never inside it
    trainer = train_one_step(runs, bases, backbone, "lora_rank=4", "lora_alpha=8")
    model = trainer.model
    inputs = fixed_inputs(model)
    with torch.no_grad():
        trained = model(*inputs).float()
    base_pipe = fresh_pipeline(backbone, bases[backbone])
    base_v = velocity_with(model, base_pipe.transformer, inputs)
    assert (
        trained - base_v
    ).abs().max() > 1e-4  # the step moved the policy: the comparison below means something

    out = tmp_path / "export"
    result = export_model(runs, 1, out)
    assert result.kind == "lora" and result.step == 1
    assert (out / LORA_WEIGHTS).is_file() and not (out / "transformer").exists()
    pipe = fresh_pipeline(backbone, bases[backbone])
    pipe.load_lora_weights(str(out))  # diffusers' own loader, from the folder
    torch.testing.assert_close(velocity_with(model, pipe.transformer, inputs), trained, atol=1e-5, rtol=1e-5)

    # the card and the run record
    card = (out / "README.md").read_text()
    front = card.split("---")[1]
    assert f"base_model: {bases[backbone]}" in front and "library_name: diffusers" in front
    assert "license:" in front and "- lora" in front
    info = json.loads((out / INFO).read_text())
    assert info["step"] == 1 and info["run"]["uid"] == trainer.run_uid and info["kind"] == "lora"
    assert info["eval"]["prompts"] == ["a red cat", "two blue dogs"] and info["eval"]["seeds"] == [0]
    assert (out / "reward_curve.png").is_file()

    # back into the engine: the base as model_path and the export as lora_path (how training goes on from it)
    again = build_model(dataclasses.replace(trainer.cfg, lora_path=str(out)))
    assert all(p.requires_grad and p.dtype == torch.float32 for p in again.trainable_parameters())
    torch.testing.assert_close(again(*inputs).float(), trained, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="lora_rank: the LoRA in .* has rank 4; set lora_rank=4"):
        build_backbone(
            backbone, model_path=bases[backbone], lora_rank=8, lora_path=str(out), **_options(backbone)
        )


def _options(backbone: str) -> dict:
    return {"resolution": 8} if backbone == "qwen-image" else {"resolution": 8, "max_sequence_length": 6}


@pytest.mark.parametrize("backbone", ["flux", "sd3"])
def test_merged_export_is_a_transformer_from_pretrained(tmp_path: Path, bases, backbone: str) -> None:
    import diffusers

    runs = tmp_path / "runs"
    trainer = train_one_step(runs, bases, backbone, "lora_rank=4")
    inputs = fixed_inputs(trainer.model)
    with torch.no_grad():
        trained = trainer.model(*inputs).float()
    out = tmp_path / "merged"
    assert export_model(runs, 1, out, merge=True).kind == "merged"
    assert not (out / LORA_WEIGHTS).exists()
    tf_cls = getattr(diffusers, PIPELINES[backbone][1])
    transformer = tf_cls.from_pretrained(str(out), subfolder="transformer")
    assert not any("lora" in n for n, _ in transformer.named_parameters())  # fused and unloaded
    torch.testing.assert_close(
        velocity_with(trainer.model, transformer, inputs), trained, atol=1e-5, rtol=1e-5
    )
    pipe = fresh_pipeline(backbone, bases[backbone], transformer=transformer)  # the card's usage lines
    torch.testing.assert_close(
        velocity_with(trainer.model, pipe.transformer, inputs), trained, atol=1e-5, rtol=1e-5
    )
    # model_path=DIR: the export's transformer over the base pipeline its jagg_run.json names
    again = build_model(dataclasses.replace(trainer.cfg, model_path=str(out), lora_rank=0))
    torch.testing.assert_close(again(*inputs).float(), trained, atol=1e-5, rtol=1e-5)


def test_full_finetune_export_is_a_transformer(tmp_path: Path, bases) -> None:
    import diffusers

    runs = tmp_path / "runs"
    trainer = train_one_step(runs, bases, "flux", "lora_rank=0", "lr=1e-3")
    inputs = fixed_inputs(trainer.model)
    with torch.no_grad():
        trained = trainer.model(*inputs).float()
    base_v = velocity_with(trainer.model, fresh_pipeline("flux", bases["flux"]).transformer, inputs)
    assert (trained - base_v).abs().max() > 1e-4
    out = tmp_path / "full"
    assert export_model(runs, 1, out).kind == "full"
    transformer = diffusers.FluxTransformer2DModel.from_pretrained(str(out), subfolder="transformer")
    torch.testing.assert_close(
        velocity_with(trainer.model, transformer, inputs), trained, atol=1e-5, rtol=1e-5
    )

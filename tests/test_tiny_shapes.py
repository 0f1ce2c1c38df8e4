"""The `tiny-shapes` backbone: shipped weights through from_pretrained, sampling quality, CFG, errors."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from jagg_engine import shapes_data as sd  # noqa: E402
from jagg_engine.backbones import Backbone, BackboneConfigError, build_backbone  # noqa: E402
from jagg_engine.backbones.tiny_shapes import (  # noqa: E402
    DEFAULT_WEIGHTS_DIR,
    build,
    pack_pixels,
    random_init,
    unpack_tokens,
)
from jagg_engine.rewards.shapes import component_scores  # noqa: E402
from jagg_engine.sde import eval_noise, ode_sample  # noqa: E402


@pytest.fixture(scope="module")
def shipped() -> Backbone:
    return build_backbone("tiny-shapes")


def test_shipped_weights_are_small_and_load(shipped: Backbone) -> None:
    size = sum(p.stat().st_size for p in DEFAULT_WEIGHTS_DIR.rglob("*") if p.is_file())
    assert size <= 20 * 2**20
    assert isinstance(shipped, Backbone)
    assert shipped.name == "tiny-shapes" and shipped.latent_shape == (64, 48)
    # the token embedding is frozen for RL by default; the transformer is what trains
    n_train = sum(p.numel() for p in shipped.trainable_parameters())
    assert n_train == sum(p.numel() for p in shipped.transformer.parameters())
    assert not shipped.embedding.weight.requires_grad
    assert build(train_embeddings=True).trainable_parameters()[-1].shape == shipped.embedding.weight.shape


def _score(model: Backbone, prompts: list[str], steps: int = 8) -> dict[str, float]:
    noise = torch.stack([eval_noise(model.latent_shape, i, 0) for i in range(len(prompts))])
    with torch.no_grad():
        images = model.decode(ode_sample(model, model.encode_prompts(prompts), noise, steps))
    return {k: v.mean().item() for k, v in component_scores(images, prompts).items()}


def test_sampling_follows_prompts_far_better_than_random_weights(shipped: Backbone) -> None:
    torch.set_num_threads(1)
    prompts = sd.all_prompts()[::5]  # 18 prompts, every colour, shape and position
    trained = _score(shipped, prompts)
    untrained = _score(build(random_weights=True, seed=1), prompts)
    assert trained["colour"] >= 0.8 and trained["position"] >= 0.8
    assert untrained["colour"] + untrained["position"] + untrained["shape"] <= 0.3
    assert trained["colour"] + trained["position"] + trained["shape"] >= 2.0


def test_unknown_word_names_the_word_and_vocabulary(shipped: Backbone) -> None:
    with pytest.raises(ValueError, match=r"unknown word 'dog'.*vocabulary: red green"):
        shipped.encode_prompts(["red circle left", "red dog left"])
    with pytest.raises(ValueError, match="at most 3 words"):
        shipped.encode_prompts(["red circle left top"])


def test_encode_decode_shapes(shipped: Backbone) -> None:
    cond = shipped.encode_prompts(["red circle left", "", "blue square"])
    assert cond["prompt_embeds"].shape == (3, 3, 64) and cond["pooled"].shape == (3, 64)
    torch.testing.assert_close(cond["pooled"], cond["prompt_embeds"].mean(1))
    null = shipped.embedding.weight[shipped.null_id]
    torch.testing.assert_close(cond["prompt_embeds"][1], null.expand(3, 64))
    torch.testing.assert_close(cond["prompt_embeds"][2, 2], null)
    latents = torch.linspace(-1.5, 1.5, 2 * 64 * 48).reshape(2, 64, 48)
    images = shipped.decode(latents)
    assert images.shape == (2, 32, 32, 3) and images.dtype == torch.uint8
    assert images.min() == 0 and images.max() == 255  # clamped


def test_pack_unpack_round_trip_and_patch_layout() -> None:
    x = torch.randn(2, 32, 32, 3)
    tokens = pack_pixels(x)
    assert tokens.shape == (2, 64, 48)
    torch.testing.assert_close(unpack_tokens(tokens), x)
    # token 9 is the patch at grid row 1, column 1
    torch.testing.assert_close(tokens[0, 9].reshape(4, 4, 3), x[0, 4:8, 4:8])


def test_cfg_combines_conditional_and_null_velocities() -> None:
    model = random_init(0, num_single_layers=1)
    z, t = torch.randn(2, 64, 48), torch.tensor([0.3, 0.8])
    cond = model.encode_prompts(["red circle left", "cyan triangle top"])
    with torch.no_grad():
        v_c = model(z, t, cond)
        v_u = model(z, t, model.encode_prompts(["", ""]))
        model.cfg_scale = 3.0
        v = model(z, t, cond)
    torch.testing.assert_close(v, v_u + 3.0 * (v_c - v_u), rtol=1e-4, atol=1e-4)


def test_save_pretrained_round_trip(tmp_path) -> None:
    model = random_init(3, num_single_layers=1)
    model.save_pretrained(tmp_path)
    loaded = build(weights_dir=tmp_path)
    assert loaded.transformer.config.num_single_layers == 1
    z, t = torch.randn(1, 64, 48), torch.tensor([0.5])
    with torch.no_grad():
        cond = model.encode_prompts(["green square center"])
        torch.testing.assert_close(
            loaded(z, t, loaded.encode_prompts(["green square center"])), model(z, t, cond)
        )


def test_build_errors(tmp_path) -> None:
    with pytest.raises(BackboneConfigError, match="missing weight files"):
        build(weights_dir=tmp_path)
    with pytest.raises(BackboneConfigError, match="cfg_scale"):
        build(cfg_scale=0.5)

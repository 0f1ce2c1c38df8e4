"""Weight-free rewards by hand; the CLIP-based and HPSv2 rewards end to end on tiny offline models."""

from __future__ import annotations

import io
import math
import os
import string

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from jagg_engine.rewards.registry import (  # noqa: E402
    RewardConfigError,
    available_rewards,
    build_reward,
    check_reward,
)

PROMPTS = ["a red cat", "two blue dogs"]


def flat(color: tuple[int, int, int], size: int = 32) -> torch.Tensor:
    return torch.tensor(color, dtype=torch.uint8).expand(size, size, 3).clone()  # (H, W, 3)


def noise(size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, 256, (size, size, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )


# ---- weight-free -------------------------------------------------------------------------------------------
def test_registered() -> None:
    names = set(available_rewards())
    assert {"jpeg_compressibility", "jpeg_incompressibility", "brightness", "colorfulness"} <= names
    assert {"pickscore", "clipscore", "hpsv2"} <= names


def test_jpeg_sizes() -> None:
    images = torch.stack([flat((120, 30, 200)), noise()])  # (2, 32, 32, 3)
    buf = io.BytesIO()
    Image.fromarray(images[1].numpy()).save(buf, format="JPEG", quality=95)
    comp = build_reward("jpeg_compressibility")(images, PROMPTS)
    incomp = build_reward("jpeg_incompressibility")(images, PROMPTS)
    assert comp.dtype == torch.float32 and comp.shape == (2,)
    assert comp[0] > comp[1]  # a flat image compresses better than noise
    assert comp[1].item() == pytest.approx(-len(buf.getvalue()) / 1000)
    torch.testing.assert_close(incomp, -comp)
    torch.testing.assert_close(
        build_reward("jpeg_compressibility", scale=1 / 500)(images, PROMPTS), comp / 500
    )
    with pytest.raises(RewardConfigError):
        check_reward("jpeg_compressibility", quality=0)


def test_brightness() -> None:
    images = torch.stack([flat((0, 0, 0)), flat((255, 255, 255)), flat((255, 0, 0)), flat((0, 0, 255))])
    got = build_reward("brightness")(images, PROMPTS * 2)
    torch.testing.assert_close(got, torch.tensor([0.0, 1.0, 0.299, 0.114]))
    torch.testing.assert_close(build_reward("brightness", scale=-1.0)(images, PROMPTS * 2), -got)


def test_colorfulness() -> None:
    half = flat((255, 0, 0))
    half[:, 16:] = torch.tensor([0, 0, 255], dtype=torch.uint8)  # left red, right blue
    got = build_reward("colorfulness", scale=1.0)(torch.stack([flat((90, 90, 90)), half]), PROMPTS)
    # red: rg = 255, yb = 127.5; blue: rg = 0, yb = −255 (half the pixels each)
    std = math.sqrt(127.5**2 + 191.25**2)
    mean = math.sqrt(127.5**2 + 63.75**2)
    torch.testing.assert_close(got, torch.tensor([0.0, std + 0.3 * mean]))
    default = build_reward("colorfulness")(half[None], PROMPTS[:1])
    assert default.item() == pytest.approx((std + 0.3 * mean) / 100, rel=1e-5)


# ---- tiny CLIP, tokenizer and processor, all offline -------------------------------------------------------
def clip_tokenizer(max_length: int = 8):
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in string.ascii_lowercase:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def tiny_clip(seed: int = 0):
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(seed)
    text = dict(
        vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    text.update(max_position_embeddings=8, eos_token_id=1, bos_token_id=0, pad_token_id=1, hidden_act="gelu")
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    vision.update(image_size=16, patch_size=8, hidden_act="gelu")
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)).eval()
    with torch.no_grad():
        model.logit_scale.fill_(3.0)
    return model


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from transformers import CLIPImageProcessor, CLIPProcessor

    folder = str(tmp_path_factory.mktemp("tiny-clip"))
    tiny_clip().save_pretrained(folder)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    CLIPProcessor(image_processor=image_processor, tokenizer=clip_tokenizer()).save_pretrained(folder)
    return folder


def test_pickscore_and_clipscore(clip_dir: str) -> None:
    from transformers import CLIPModel, CLIPProcessor

    images = torch.stack([noise(20, 1), noise(20, 2)])
    pick = build_reward("pickscore", model=clip_dir)(images, PROMPTS)
    clip = build_reward("clipscore", model=clip_dir)(images, PROMPTS)
    assert pick.shape == clip.shape == (2,) and pick.dtype == clip.dtype == torch.float32

    # by hand, through CLIPModel's own forward: logits_per_image = exp(logit_scale) · cos
    model, proc = CLIPModel.from_pretrained(clip_dir).eval(), CLIPProcessor.from_pretrained(clip_dir)
    inputs = proc(
        text=PROMPTS,
        images=list(images.numpy()),
        padding=True,
        truncation=True,
        max_length=8,
        return_tensors="pt",
    )
    with torch.no_grad():
        logits = model(**inputs).logits_per_image.diagonal()  # (2,)
    torch.testing.assert_close(pick, logits / 26)
    cos = logits / math.exp(3.0)
    torch.testing.assert_close(clip, 100 * cos.clamp(min=0))
    # the text matters
    assert not torch.allclose(build_reward("pickscore", model=clip_dir)(images, PROMPTS[::-1]), pick)


def test_clip_rewards_check_sources(clip_dir: str, tmp_path) -> None:
    for name in ("pickscore", "clipscore"):
        check_reward(name, model=clip_dir)  # a complete local folder passes
        with pytest.raises(RewardConfigError, match="does not exist") as info:
            check_reward(name, model=str(tmp_path / "nowhere"))
        assert "\n" not in str(info.value) and "model=/path/to/folder" in str(info.value)
        with pytest.raises(RewardConfigError, match="none of config.json"):
            check_reward(name, model=str(tmp_path))
        with pytest.raises(RewardConfigError, match="processor"):
            check_reward(name, model=clip_dir, processor=str(tmp_path))
        with pytest.raises(
            RewardConfigError, match="not in the hub cache"
        ):  # HF_HUB_OFFLINE=1, nothing cached
            check_reward(name, model="nobody/no-such-clip-model")


# ---- HPSv2 through an open_clip-format checkpoint ----------------------------------------------------------
def test_open_clip_key_round_trip() -> None:
    from jagg_engine.rewards.hps import open_clip_to_transformers, transformers_to_open_clip

    state = {k: v for k, v in tiny_clip().state_dict().items() if not k.endswith("position_ids")}
    oc = transformers_to_open_clip(state)
    assert "visual.transformer.resblocks.1.attn.in_proj_weight" in oc and oc["visual.proj"].shape == (16, 8)
    assert oc["transformer.resblocks.0.attn.in_proj_bias"].shape == (48,) and "token_embedding.weight" in oc
    back = open_clip_to_transformers(oc)
    assert back.keys() == state.keys()
    for k in state:
        assert torch.equal(back[k], state[k]), k
    with pytest.raises(ValueError, match="unexpected open_clip keys"):
        open_clip_to_transformers({**oc, "visual.attn_pool.query": torch.zeros(1)})


def test_open_clip_preprocess() -> None:
    from jagg_engine.rewards.hps import OPENAI_MEAN, OPENAI_STD, open_clip_preprocess

    wide = noise(32)[:16]  # (16, 32, 3): shorter side already 16 → no resize, center crop columns 8..23
    got = open_clip_preprocess(wide[None], 16)
    expect = (
        wide[:, 8:24].permute(2, 0, 1).float() / 255 - torch.tensor(OPENAI_MEAN)[:, None, None]
    ) / torch.tensor(OPENAI_STD)[:, None, None]
    torch.testing.assert_close(got[0], expect)
    big = open_clip_preprocess(torch.stack([flat((255, 0, 0), 40), noise(40)]), 16)
    assert big.shape == (2, 3, 16, 16)
    red = (torch.tensor([1.0, 0.0, 0.0]) - torch.tensor(OPENAI_MEAN)) / torch.tensor(OPENAI_STD)
    torch.testing.assert_close(big[0], red[:, None, None].expand(3, 16, 16))  # a flat image stays flat


def test_hpsv2_end_to_end(tmp_path) -> None:
    from jagg_engine.rewards.hps import open_clip_preprocess, transformers_to_open_clip

    model = tiny_clip(seed=3)
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("position_ids")}
    checkpoint = tmp_path / "HPS_v2.1_tiny.pt"
    torch.save({"state_dict": transformers_to_open_clip(state)}, checkpoint)
    tokenizer_dir = tmp_path / "tokenizer"
    clip_tokenizer().save_pretrained(tokenizer_dir)

    options = dict(checkpoint=str(checkpoint), tokenizer=str(tokenizer_dir), vision_heads=2, text_heads=2)
    check_reward("hpsv2", **options)
    images = torch.stack([noise(24, 5), noise(24, 6)])
    got = build_reward("hpsv2", **options)(images, PROMPTS)
    assert got.shape == (2,) and got.dtype == torch.float32

    # by hand: the original model, the same preprocessing, cos = logits_per_image / exp(logit_scale)
    text = clip_tokenizer()(PROMPTS, padding="max_length", max_length=8, truncation=True, return_tensors="pt")
    with torch.no_grad():
        out = model(pixel_values=open_clip_preprocess(images, 16), **text)
    torch.testing.assert_close(
        got, out.logits_per_image.diagonal() / model.logit_scale.exp(), rtol=0, atol=1e-6
    )
    assert (got.abs() <= 1).all()
    assert not torch.allclose(build_reward("hpsv2", **options)(images, PROMPTS[::-1]), got)


def test_hpsv2_check_reports_missing_files(tmp_path) -> None:
    with pytest.raises(RewardConfigError, match="no checkpoint given"):
        check_reward("hpsv2")
    with pytest.raises(RewardConfigError, match="not found") as info:
        check_reward("hpsv2", checkpoint=str(tmp_path / "HPS_v2.1_compressed.pt"))
    msg = str(info.value)
    assert "\n" not in msg and "checkpoint=/path/to/HPS_v2.1_compressed.pt" in msg
    (tmp_path / "ckpt.pt").write_bytes(b"")
    with pytest.raises(RewardConfigError, match="tokenizer"):
        check_reward("hpsv2", checkpoint=str(tmp_path / "ckpt.pt"), tokenizer=str(tmp_path / "no-tokenizer"))

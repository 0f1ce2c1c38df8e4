"""`hpsv2`: Human Preference Score v2.1 (Wu et al. 2023) from a local open_clip-format checkpoint.

HPSv2.1 is an open_clip ViT-H-14 fine-tuned on human preferences; its score is cos(image, text) of the unit
image and text embeddings (the diagonal of image_features @ text_featuresᵀ, as the hpsv2 package computes it).
The ``hpsv2`` package downloads its checkpoints on every call and open_clip needs torchvision, so this module
instead converts the open_clip state dict (``HPS_v2.1_compressed.pt``: ``{"state_dict": {...}}``) into a
transformers ``CLIPModel`` and reimplements open_clip's evaluation preprocessing in torch:

    resize the shorter side to 224 (bicubic, antialiased) → center crop 224 → [0, 1] → normalize with the
    OpenAI CLIP mean/std.

(open_clip resizes a PIL image, which rounds to uint8 after resizing; here the resized image stays float,
so scores can differ from the package's in the third decimal.) Text goes through a CLIP tokenizer (local
folder or hub id, default the ViT-H-14 one), padded to the 77-token context as open_clip does.

Sizes (width, layers, patch, image size, context, vocabulary, embedding) are read from the checkpoint's
tensor shapes; only the head counts are options (ViT-H-14: 16 and 16).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import torch

from ..devices import resolve_device
from .clip_based import TOKENIZER_FILES, check_source, clip_embeddings
from .registry import RewardConfigError, register_reward

DEFAULT_TOKENIZER = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # open_clip's OPENAI_DATASET_MEAN
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
HINT = "download HPS_v2.1_compressed.pt (hub xswu/HPSv2); pass checkpoint=/path/to/HPS_v2.1_compressed.pt"

# ---- open_clip ⇄ transformers CLIPModel keys ---------------------------------------------------------------
_BLOCK = (
    ("ln_1", "layer_norm1"),
    ("ln_2", "layer_norm2"),
    ("attn.out_proj", "self_attn.out_proj"),
    ("mlp.c_fc", "mlp.fc1"),
    ("mlp.c_proj", "mlp.fc2"),
)


def _renames(n_vision: int, n_text: int) -> list[tuple[str, str]]:
    """(open_clip key, transformers key) pairs that copy a tensor unchanged."""
    pairs = [
        ("visual.class_embedding", "vision_model.embeddings.class_embedding"),
        ("visual.conv1.weight", "vision_model.embeddings.patch_embedding.weight"),
        ("visual.positional_embedding", "vision_model.embeddings.position_embedding.weight"),
        ("token_embedding.weight", "text_model.embeddings.token_embedding.weight"),
        ("positional_embedding", "text_model.embeddings.position_embedding.weight"),
        ("logit_scale", "logit_scale"),
    ]
    for oc, hf in (
        ("visual.ln_pre", "vision_model.pre_layrnorm"),
        ("visual.ln_post", "vision_model.post_layernorm"),
    ):
        pairs += [(f"{oc}.{p}", f"{hf}.{p}") for p in ("weight", "bias")]
    pairs += [(f"ln_final.{p}", f"text_model.final_layer_norm.{p}") for p in ("weight", "bias")]
    for n, oc_tower, hf_tower in (
        (n_vision, "visual.transformer", "vision_model"),
        (n_text, "transformer", "text_model"),
    ):
        for i in range(n):
            for a, b in _BLOCK:
                pairs += [
                    (f"{oc_tower}.resblocks.{i}.{a}.{p}", f"{hf_tower}.encoder.layers.{i}.{b}.{p}")
                    for p in ("weight", "bias")
                ]
    return pairs


def _attention(n_vision: int, n_text: int) -> list[tuple[str, str]]:
    """(open_clip block prefix, transformers layer prefix) of every attention (fused qkv ⇄ q, k, v)."""
    out = [
        (f"visual.transformer.resblocks.{i}.attn", f"vision_model.encoder.layers.{i}.self_attn")
        for i in range(n_vision)
    ]
    return out + [
        (f"transformer.resblocks.{i}.attn", f"text_model.encoder.layers.{i}.self_attn") for i in range(n_text)
    ]


_PROJECTIONS = (
    ("visual.proj", "visual_projection.weight"),
    ("text_projection", "text_projection.weight"),
)  # xW ⇄ Wᵀ


def _count_layers(keys: Sequence[str], pattern: str) -> int:
    found = {int(m.group(1)) for k in keys if (m := re.match(pattern, k))}
    return max(found) + 1 if found else 0


def open_clip_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename open_clip CLIP keys to transformers CLIPModel keys (split qkv, transpose projections)."""
    state = {k.removeprefix("module."): v for k, v in state.items()}
    n_vision = _count_layers(list(state), r"visual\.transformer\.resblocks\.(\d+)\.")
    n_text = _count_layers(list(state), r"transformer\.resblocks\.(\d+)\.")
    out, used = {}, set()
    for oc, hf in _renames(n_vision, n_text):
        out[hf] = state[oc]
        used.add(oc)
    for oc, hf in _attention(n_vision, n_text):
        for kind in ("weight", "bias"):
            q, k, v = state[f"{oc}.in_proj_{kind}"].chunk(3, dim=0)  # (3w, ...) → 3 × (w, ...)
            out.update({f"{hf}.q_proj.{kind}": q, f"{hf}.k_proj.{kind}": k, f"{hf}.v_proj.{kind}": v})
            used.add(f"{oc}.in_proj_{kind}")
    for oc, hf in _PROJECTIONS:
        out[hf] = state[oc].t().contiguous()  # open_clip: x @ P (w, e); transformers: Linear weight (e, w)
        used.add(oc)
    extra = sorted(set(state) - used - {"attn_mask"})
    if extra:
        raise ValueError(f"unexpected open_clip keys (not a plain CLIP ViT): {', '.join(extra[:4])}")
    return out


def transformers_to_open_clip(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`open_clip_to_transformers` (fuse q, k, v; transpose projections)."""
    n_vision = _count_layers(list(state), r"vision_model\.encoder\.layers\.(\d+)\.")
    n_text = _count_layers(list(state), r"text_model\.encoder\.layers\.(\d+)\.")
    out = {oc: state[hf] for oc, hf in _renames(n_vision, n_text)}
    for oc, hf in _attention(n_vision, n_text):
        for kind in ("weight", "bias"):
            out[f"{oc}.in_proj_{kind}"] = torch.cat([state[f"{hf}.{p}_proj.{kind}"] for p in "qkv"], dim=0)
    for oc, hf in _PROJECTIONS:
        out[oc] = state[hf].t().contiguous()
    return out


def clip_config_from_state(
    state: dict[str, torch.Tensor],
    vision_heads: int,
    text_heads: int,
    tokenizer=None,
    hidden_act: str = "gelu",
):
    """A transformers CLIPConfig matching a transformers-keyed CLIP state dict (sizes read from shapes)."""
    from transformers import CLIPConfig

    patch = state["vision_model.embeddings.patch_embedding.weight"]  # (w_v, 3, p, p)
    n_pos = state["vision_model.embeddings.position_embedding.weight"].shape[0]  # grid² + 1
    grid = round((n_pos - 1) ** 0.5)
    tokens = state["text_model.embeddings.token_embedding.weight"]  # (vocab, w_t)
    embed_dim = state["text_projection.weight"].shape[0]
    w_v, w_t = patch.shape[0], tokens.shape[1]
    if w_v % vision_heads or w_t % text_heads:
        raise ValueError(f"head counts {vision_heads}/{text_heads} do not divide the widths {w_v}/{w_t}")
    ids = {}
    if tokenizer is not None:
        ids = dict(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    text = dict(
        vocab_size=tokens.shape[0],
        hidden_size=w_t,
        intermediate_size=state["text_model.encoder.layers.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=_count_layers(list(state), r"text_model\.encoder\.layers\.(\d+)\."),
        num_attention_heads=text_heads,
        max_position_embeddings=state["text_model.embeddings.position_embedding.weight"].shape[0],
        hidden_act=hidden_act,
        projection_dim=embed_dim,
        **ids,
    )
    vision = dict(
        hidden_size=w_v,
        intermediate_size=state["vision_model.encoder.layers.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=_count_layers(list(state), r"vision_model\.encoder\.layers\.(\d+)\."),
        num_attention_heads=vision_heads,
        image_size=grid * patch.shape[-1],
        patch_size=patch.shape[-1],
        hidden_act=hidden_act,
        projection_dim=embed_dim,
    )
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=embed_dim)


def open_clip_preprocess(images: torch.Tensor, size: int) -> torch.Tensor:
    """open_clip's eval transform in torch. (B, H, W, 3) uint8 → (B, 3, size, size) float32, normalized.

    Resize the shorter side to ``size`` (longer side int(size·long/short), bicubic with antialiasing), center
    crop (torchvision's rounding), scale to [0, 1], normalize with the OpenAI CLIP mean/std.
    """
    x = images.permute(0, 3, 1, 2).float() / 255.0  # (B, 3, H, W)
    h, w = x.shape[-2:]
    short, long = min(h, w), max(h, w)
    new_long = int(size * long / short)
    nh, nw = (size, new_long) if h <= w else (new_long, size)
    if (nh, nw) != (h, w):
        x = torch.nn.functional.interpolate(
            x, size=(nh, nw), mode="bicubic", antialias=True, align_corners=False
        )
        x = x.clamp(0, 1)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    x = x[..., top : top + size, left : left + size]  # (B, 3, size, size)
    mean = torch.tensor(OPENAI_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(OPENAI_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def load_open_clip_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict of an open_clip checkpoint file (``{"state_dict": ...}`` or the bare dict)."""
    obj = torch.load(path, map_location="cpu", weights_only=True)
    return obj.get("state_dict", obj) if isinstance(obj, dict) else obj


class HPSv2:
    """HPSv2(.1) score cos(image, text) with an open_clip checkpoint converted to a transformers CLIPModel."""

    def __init__(
        self,
        checkpoint: str,
        tokenizer: str = DEFAULT_TOKENIZER,
        vision_heads: int = 16,
        text_heads: int = 16,
        device: str | None = None,
        batch_size: int = 16,
        scale: float = 1.0,
    ):
        from transformers import CLIPModel, CLIPTokenizer

        self.device = resolve_device(device)
        self.batch_size, self.scale = batch_size, scale
        self.tokenizer = CLIPTokenizer.from_pretrained(tokenizer)
        state = open_clip_to_transformers(load_open_clip_checkpoint(checkpoint))
        config = clip_config_from_state(state, vision_heads, text_heads, self.tokenizer)
        model = CLIPModel(config)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("position_ids")]
        if missing or unexpected:
            raise ValueError(
                f"hpsv2: checkpoint is not a CLIP ViT: missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.image_size = config.vision_config.image_size
        self.context = config.text_config.max_position_embeddings

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """images (B, H, W, 3) uint8, B prompts → (B,) float32 cos(image, text) · scale."""
        scores = []
        for i in range(0, images.shape[0], self.batch_size):
            pixels = open_clip_preprocess(images[i : i + self.batch_size], self.image_size).to(self.device)
            text = self.tokenizer(
                list(prompts[i : i + self.batch_size]),
                padding="max_length",
                truncation=True,
                max_length=self.context,
                return_tensors="pt",
            )
            img, txt = clip_embeddings(
                self.model,
                pixels.to(self.model.dtype),
                text["input_ids"].to(self.device),
                text["attention_mask"].to(self.device),
            )
            scores.append((img * txt).sum(-1))  # (b,) cosine
        return (self.scale * torch.cat(scores)).float().cpu()


def check_hpsv2(
    checkpoint: str | None = None,
    tokenizer: str = DEFAULT_TOKENIZER,
    vision_heads: int = 16,
    text_heads: int = 16,
    device: str | None = None,
    batch_size: int = 16,
    scale: float = 1.0,
) -> None:
    """The checkpoint file exists and the tokenizer source is usable; loads nothing."""
    if checkpoint is None:
        raise RewardConfigError(f"hpsv2: no checkpoint given; {HINT}")
    if not Path(checkpoint).expanduser().is_file():
        raise RewardConfigError(f"hpsv2: checkpoint file {checkpoint!r} not found; {HINT}")
    if min(vision_heads, text_heads, batch_size) < 1:
        raise RewardConfigError("hpsv2: vision_heads, text_heads and batch_size must be >= 1")
    check_source("hpsv2", "tokenizer", tokenizer, TOKENIZER_FILES)


@register_reward(
    "hpsv2",
    check=check_hpsv2,
    help="HPSv2.1 cos(image, text), local open_clip checkpoint; options checkpoint (required), tokenizer",
)
def hpsv2(checkpoint: str, **options: object) -> HPSv2:
    return HPSv2(str(Path(checkpoint).expanduser()), **options)

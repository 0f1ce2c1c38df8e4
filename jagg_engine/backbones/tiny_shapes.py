"""`tiny-shapes`: a 2.3 M-parameter pixel-space Flux transformer pretrained on :mod:`jagg_engine.shapes_data`.

The latent is the image itself: a 32×32 RGB image in [−1, 1] is cut into 4×4 pixel patches, each flattened
to one token of 4·4·3 = 48 channels, so ``z`` has shape (B, 64, 48) and ``decode`` is an unpacking plus a
map to uint8. The text encoder is an embedding table over the closed vocabulary (14 words) plus a null token
(caption dropout during pretraining, the unconditional branch of classifier-free guidance); the 3 word
embeddings are the text tokens and their mean is the pooled projection.

``cond`` is ``{"prompt_embeds": (B, 3, 64), "pooled": (B, 64)}`` (what :class:`FluxVelocity` expects).
With ``cfg_scale`` s > 1 the velocity callable returns v_u + s·(v_c − v_u) (Ho & Salimans 2022,
classifier-free guidance), evaluating the null caption in the same batch.

Weights live in ``assets/tiny-shapes/``: ``transformer/`` (diffusers ``save_pretrained``),
``text_embedding.safetensors`` and ``vocab.json``; ``scripts/pretrain_tiny_shapes.py`` reproduces them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import load_file, save_file

from .. import shapes_data
from .base import Cond
from .flux_core import FluxVelocity

DEFAULT_WEIGHTS_DIR = shapes_data.DEFAULT_WEIGHTS_DIR
PATCH = 4
GRID = (shapes_data.IMAGE_SIZE // PATCH, shapes_data.IMAGE_SIZE // PATCH)  # (8, 8) tokens
TEXT_LEN = shapes_data.TEXT_LEN
EMBED_DIM = 64

TINY_SHAPES_CONFIG: dict[str, Any] = dict(
    patch_size=1,
    in_channels=PATCH * PATCH * 3,
    num_layers=2,
    num_single_layers=4,
    attention_head_dim=32,
    num_attention_heads=4,
    joint_attention_dim=EMBED_DIM,
    pooled_projection_dim=EMBED_DIM,
    guidance_embeds=False,
    axes_dims_rope=(8, 12, 12),
)


def pack_pixels(images: torch.Tensor) -> torch.Tensor:
    """Float images (B, H, W, 3) → tokens (B, H/4 · W/4, 48), row-major over 4×4 patches."""
    b, h, w, c = images.shape
    x = images.reshape(b, h // PATCH, PATCH, w // PATCH, PATCH, c)  # (B, h, p, w, p, 3)
    x = x.permute(0, 1, 3, 2, 4, 5)  # (B, h, w, p, p, 3)
    return x.reshape(b, (h // PATCH) * (w // PATCH), PATCH * PATCH * c)  # (B, N, 48)


def unpack_tokens(tokens: torch.Tensor, grid: tuple[int, int] = GRID) -> torch.Tensor:
    """Inverse of :func:`pack_pixels`: tokens (B, N, 48) → float images (B, H, W, 3)."""
    b = tokens.shape[0]
    gh, gw = grid
    x = tokens.reshape(b, gh, gw, PATCH, PATCH, 3)  # (B, h, w, p, p, 3)
    x = x.permute(0, 1, 3, 2, 4, 5)  # (B, h, p, w, p, 3)
    return x.reshape(b, gh * PATCH, gw * PATCH, 3)  # (B, H, W, 3)


class TinyShapes(torch.nn.Module):
    """The `tiny-shapes` backbone (see the module docstring).

    Args:
        transformer: a FluxTransformer2DModel with :data:`TINY_SHAPES_CONFIG` (or a smaller variant).
        vocabulary: the closed vocabulary; token id ``len(vocabulary)`` is the null token.
        embedding: (len(vocabulary) + 1, 64) table; ``None`` for a seeded random one.
        cfg_scale: classifier-free guidance scale at sampling; 1 disables guidance (one forward pass).
        train_embeddings: whether ``trainable_parameters`` includes the token embedding (default: frozen).
    """

    name = "tiny-shapes"

    def __init__(
        self,
        transformer: FluxTransformer2DModel,
        vocabulary: Sequence[str] = shapes_data.VOCABULARY,
        embedding: torch.Tensor | None = None,
        cfg_scale: float = 1.0,
        train_embeddings: bool = False,
    ):
        super().__init__()
        if cfg_scale < 1.0:
            raise ValueError(f"tiny-shapes: cfg_scale must be ≥ 1, got {cfg_scale}")
        self.vocabulary = tuple(vocabulary)
        self.token_ids = {w: i for i, w in enumerate(self.vocabulary)}
        self.null_id = len(self.vocabulary)
        self.embedding = torch.nn.Embedding(self.null_id + 1, transformer.config.joint_attention_dim)
        if embedding is not None:
            with torch.no_grad():
                self.embedding.weight.copy_(embedding)
        self.embedding.requires_grad_(train_embeddings)
        self.train_embeddings = train_embeddings
        self.cfg_scale = float(cfg_scale)
        self.velocity = FluxVelocity(transformer, grid=GRID, text_len=TEXT_LEN)
        self.latent_shape: tuple[int, ...] = self.velocity.latent_shape  # (64, 48)

    @property
    def transformer(self) -> FluxTransformer2DModel:
        return self.velocity.transformer

    def tokenize(self, prompts: Sequence[str]) -> torch.Tensor:
        """Prompts → token ids (B, 3). The empty prompt is the null caption; unknown words raise ValueError."""
        shapes_data.check_words(prompts, self.vocabulary)
        rows = []
        for p in prompts:
            ids = [self.token_ids[w] for w in p.split()]
            rows.append(ids + [self.null_id] * (TEXT_LEN - len(ids)))
        return torch.tensor(rows, dtype=torch.long, device=self.embedding.weight.device)  # (B, 3)

    def embed_tokens(self, ids: torch.Tensor) -> Cond:
        """Token ids (B, 3) → cond: prompt_embeds (B, 3, 64) and pooled = their mean (B, 64)."""
        embeds = self.embedding(ids)  # (B, 3, 64)
        return {"prompt_embeds": embeds, "pooled": embeds.mean(dim=1)}

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        return self.embed_tokens(self.tokenize(prompts))

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> torch.Tensor:
        """v̂(z, t, cond), z (B, 64, 48), t (B,); guided by ``cfg_scale`` when it is > 1."""
        if self.cfg_scale == 1.0:
            return self.velocity(z, t, cond)
        b = z.shape[0]
        null = self.embed_tokens(torch.full((b, TEXT_LEN), self.null_id, device=z.device))
        both = {k: torch.cat([cond[k], null[k]], dim=0) for k in ("prompt_embeds", "pooled")}
        v = self.velocity(torch.cat([z, z]), torch.cat([t, t]), both)  # (2B, 64, 48)
        v_c, v_u = v[:b], v[b:]
        return v_u + self.cfg_scale * (v_c - v_u)

    def sample_prompts(self, n: int, seed: int = 0) -> list[str]:
        """``n`` prompts of the closed vocabulary drawn reproducibly (for probes and benches)."""
        return shapes_data.sample_prompts(n, seed)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, 64, 48) in [−1, 1] → uint8 images (B, 32, 32, 3) on the CPU."""
        images = unpack_tokens(latents.detach().float().cpu())
        return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        params = [p for p in self.transformer.parameters() if p.requires_grad]
        if self.train_embeddings:
            params.append(self.embedding.weight)
        return params

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``transformer/`` (diffusers format), ``text_embedding.safetensors`` and ``vocab.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.transformer.save_pretrained(directory / "transformer")
        weight = self.embedding.weight.detach().float().cpu().contiguous()
        save_file({"weight": weight}, str(directory / "text_embedding.safetensors"))
        (directory / "vocab.json").write_text(
            json.dumps({"vocabulary": list(self.vocabulary), "null_id": self.null_id}, indent=1) + "\n"
        )


def random_init(seed: int = 0, **config_overrides: Any) -> TinyShapes:
    """An untrained tiny-shapes model with seeded random weights (pretraining start, tests, baselines)."""
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(**{**TINY_SHAPES_CONFIG, **config_overrides})
    return TinyShapes(transformer, train_embeddings=True)


WEIGHT_FILES = ("transformer/config.json", "text_embedding.safetensors", "vocab.json")


def missing_weight_files(directory: str | Path) -> list[str]:
    """The files of :data:`WEIGHT_FILES` that ``directory`` lacks (all of them when it is not a folder)."""
    return [name for name in WEIGHT_FILES if not (Path(directory) / name).is_file()]


def build(
    weights_dir: str | Path | None = None,
    cfg_scale: float = 1.0,
    dtype: torch.dtype | str = torch.float32,
    train_embeddings: bool = False,
    random_weights: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> TinyShapes:
    """The `tiny-shapes` backbone from ``weights_dir`` (default: the shipped ``assets/tiny-shapes``).

    ``random_weights=True`` builds the same architecture with seeded random weights instead (a baseline).
    """
    from . import BackboneConfigError

    if isinstance(dtype, str):
        if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
            raise BackboneConfigError(f"tiny-shapes: unknown dtype {dtype!r}; e.g. float32, bfloat16")
        dtype = getattr(torch, dtype)
    if cfg_scale < 1.0:
        raise BackboneConfigError(f"tiny-shapes: cfg_scale must be ≥ 1, got {cfg_scale}")
    if random_weights:
        model = random_init(seed)
        model.embedding.requires_grad_(train_embeddings)
        model.train_embeddings = train_embeddings
        model.cfg_scale = float(cfg_scale)
    else:
        directory = Path(weights_dir) if weights_dir is not None else DEFAULT_WEIGHTS_DIR
        missing = [str(directory / name) for name in missing_weight_files(directory)]
        if missing:
            raise BackboneConfigError(
                f"tiny-shapes: missing weight files {', '.join(missing)}; run scripts/pretrain_tiny_shapes.py"
            )
        transformer = FluxTransformer2DModel.from_pretrained(directory, subfolder="transformer")
        try:
            vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
            if not isinstance(vocab, dict) or not isinstance(vocab.get("vocabulary"), list):
                raise ValueError("no vocabulary list")
        except (OSError, ValueError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else type(exc).__name__
            raise BackboneConfigError(
                f"tiny-shapes: {directory / 'vocab.json'}: unreadable ({why})"
            ) from None
        embedding = load_file(str(directory / "text_embedding.safetensors"))["weight"]
        model = TinyShapes(
            transformer,
            vocabulary=vocab["vocabulary"],
            embedding=embedding,
            cfg_scale=cfg_scale,
            train_embeddings=train_embeddings,
        )
    model.eval()
    return model.to(device=device, dtype=dtype)

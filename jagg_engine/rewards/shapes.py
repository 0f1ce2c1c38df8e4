"""A programmatic verifier for `tiny-shapes` images, GenEval-style, and a denser variant for GRPO.

For each image and its caption "colour shape position" (:mod:`jagg_engine.shapes_data`):

1. colour mask: pixels bright enough (max channel ≥ 64) whose RGB direction is nearest the caption's colour
   among the 6 palette colours (cosine ≥ 0.9; anti-aliased edges keep the direction, so they count);
2. the blob: the largest 8-connected component of that mask; the colour is *present* if it has ≥ 12 pixels;
3. position: the blob's bounding-box centre must be nearest the caption's anchor among the 5 anchors;
4. shape, from two features of the blob's half-intensity mask (pixels ≥ ½ of the blob's bright level):
   ``fill`` = area / bounding-box area (square 1, circle π/4, triangle ½) and ``top`` = share of the area in
   the upper half of the box (triangle ¼, circle and square ½). Decision: triangle if top < 0.4, else square
   if fill ≥ 0.87, else circle. Fill and top share are soft (anti-aliased coverage relative to the blob's
   bright level, soft box extents), so they hold for shapes of 8–12 px. On clean data the classes sit far
   apart (fill: circle ≤ 0.85, square ≥ 0.99; top: triangle ≤ 0.31, others ≥ 0.47). Samples of the shipped
   model draw triangles (median top 0.37 vs 0.47 for the others) but squares with rounded corners (median
   fill 0.77, circles 0.75), so any FILL_SQUARE between 0.86 and 0.92 scores them the same (squares called
   square 0.00, circles called circle 0.95); ``scripts/verifier_accuracy.py --model-samples N`` prints both
   distributions and that sweep.

``shapes`` = mean of the three 0/1 checks (0 when the colour is absent, as in GenEval, Ghosh et al. 2023).
``shapes-dense`` = that + 0.5·shape_c + 0.1·colour_c + 0.1·position_c with continuous margins:
shape_c = clip(margin / 0.2, −1, 1), margin = how far the blob's features sit inside the right class region
(in fill / top units); colour_c = blob pixels / all non-background pixels; position_c = exp(−d² / (2·0.08²))
for the distance d (in image sides) of the box centre to the anchor. Ties inside a GRPO group of the 0/⅓/⅔/1
score are what the dense terms break.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .. import shapes_data
from .registry import register_reward

BRIGHT = 64  # max channel (0–255) for a pixel to count as foreground
MIN_COSINE = 0.97  # RGB-direction agreement with a palette colour
MIN_BLOB = 16  # pixels for a colour to count as present
TOP_TRIANGLE = 0.40  # top-half area share below which a blob is a triangle
FILL_SQUARE = 0.87  # fill ratio at or above which a (non-triangle) blob is a square
SHAPE_MARGIN_SCALE = 0.2
POSITION_SIGMA = 0.08  # in image sides

_PALETTE = np.array([shapes_data.COLOURS[c] for c in shapes_data.COLOUR_NAMES], dtype=np.float32)  # (6, 3)
_PALETTE_DIR = _PALETTE / np.linalg.norm(_PALETTE, axis=1, keepdims=True)
_ANCHORS = np.array(
    [shapes_data.POSITIONS[p] for p in shapes_data.POSITION_NAMES], dtype=np.float32
)  # (5, 2)


def connected_components(mask: torch.Tensor, max_iter: int = 256) -> torch.Tensor:
    """8-connected component labels of a boolean mask (B, H, W): label = smallest flat index in the component.

    Background gets label −1. Label propagation by 3×3 min-pooling until nothing changes (batched).
    """
    b, h, w = mask.shape
    big = h * w
    idx = torch.arange(big, dtype=torch.float32).reshape(1, h, w).expand(b, h, w)
    labels = torch.where(mask, idx, torch.full_like(idx, big))  # (B, H, W)
    for _ in range(max_iter):
        pooled = -torch.nn.functional.max_pool2d(-labels[:, None], 3, stride=1, padding=1)[:, 0]  # 3×3 min
        new = torch.where(mask, torch.minimum(labels, pooled), labels)
        if torch.equal(new, labels):
            break
        labels = new
    return torch.where(mask, labels, torch.full_like(labels, -1)).long()


def _prompt_indices(prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    specs = [shapes_data.parse_prompt(p) for p in prompts]
    colour = np.array([shapes_data.COLOUR_NAMES.index(s.colour) for s in specs])
    shape = np.array([shapes_data.SHAPES.index(s.shape) for s in specs])
    position = np.array([shapes_data.POSITION_NAMES.index(s.position) for s in specs])
    return colour, shape, position


def blob_features(images: torch.Tensor, prompts: Sequence[str]) -> dict[str, np.ndarray]:
    """Per-image features of the largest blob of the prompt's colour.

    Args:
        images: uint8 (B, H, W, 3).
        prompts: B captions "colour shape position".
    Returns:
        dict of (B,) arrays: ``pixels`` (blob size), ``foreground`` (all non-background pixels), ``cx``,
        ``cy`` (box centre, in image sides), ``fill``, ``top`` (NaN when there is no blob).
    """
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"shapes reward: images must be (B, H, W, 3) uint8, got {tuple(images.shape)}")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"shapes reward: {images.shape[0]} images but {len(prompts)} prompts")
    colour_idx, _, _ = _prompt_indices(prompts)
    x = images.detach().cpu().float()  # (B, H, W, 3)
    b, h, w, _ = x.shape
    value = x.amax(dim=-1)  # (B, H, W)
    direction = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    cosine = direction @ torch.from_numpy(_PALETTE_DIR).T  # (B, H, W, 6)
    best_cos, nearest = cosine.max(dim=-1)
    foreground = value >= BRIGHT
    target = torch.from_numpy(colour_idx)[:, None, None]
    mask = foreground & (nearest == target) & (best_cos >= MIN_COSINE)  # (B, H, W)
    labels = connected_components(mask)

    out = {k: np.full(b, np.nan, dtype=np.float32) for k in ("cx", "cy", "fill", "top")}
    out["pixels"] = np.zeros(b, dtype=np.float32)
    out["foreground"] = foreground.flatten(1).sum(1).numpy().astype(np.float32)
    labels_np, value_np = labels.numpy(), value.numpy()
    for i in range(b):
        lab = labels_np[i]
        if (lab >= 0).sum() == 0:
            continue
        counts = np.bincount(lab[lab >= 0].ravel())
        blob = lab == counts.argmax()
        out["pixels"][i] = blob.sum()
        peak = max(float(np.percentile(value_np[i][blob], 90)), 1.0)
        cover = np.where(blob, np.clip(value_np[i] / peak, 0.0, 1.0), 0.0)  # (H, W) soft coverage
        area = float(cover.sum())
        row_max, col_max = cover.max(axis=1), cover.max(axis=0)  # (H,), (W,)
        height, width = float(row_max.sum()), float(col_max.sum())  # soft extents, ≈ 2r
        out["fill"][i] = area / (height * width)
        first_row = int(np.nonzero(row_max)[0][0])
        mid = first_row + 1.0 - row_max[first_row] + height / 2  # soft box middle, in pixels from the top
        upper = np.clip(mid - np.arange(h), 0.0, 1.0)  # share of each pixel row above the middle
        out["top"][i] = float((cover.sum(axis=1) * upper).sum()) / area
        ys, xs = np.nonzero(blob)
        out["cx"][i] = (xs.min() + xs.max() + 1) / 2 / w
        out["cy"][i] = (ys.min() + ys.max() + 1) / 2 / h
    return out


def shape_margins(fill: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Signed margins (B, 3) of each class (circle, square, triangle): > 0 iff the rule picks that class."""
    # The top share separates triangles from the rest by a wide gap (¼ vs ½), so its margin counts double
    # and the fill margin decides between circle and square.
    tri = 2 * (TOP_TRIANGLE - top)
    sq = np.minimum(-tri, fill - FILL_SQUARE)
    circ = np.minimum(-tri, FILL_SQUARE - fill)
    return np.stack([circ, sq, tri], axis=-1)


def component_scores(images: torch.Tensor, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
    """Per-image checks for eval reports and the rewards, each (B,) float32.

    ``colour``, ``position``, ``shape`` are 0/1 (position and shape are 0 when the colour is absent);
    ``colour_c``, ``position_c``, ``shape_c`` are the continuous terms of ``shapes-dense``.
    """
    feats = blob_features(images, prompts)
    _, shape_idx, pos_idx = _prompt_indices(prompts)
    present = feats["pixels"] >= MIN_BLOB
    centre = np.stack([feats["cx"], feats["cy"]], axis=-1)  # (B, 2)
    dist = np.linalg.norm(centre[:, None, :] - _ANCHORS[None], axis=-1)  # (B, 5)
    nearest = np.nan_to_num(dist, nan=np.inf).argmin(axis=1)
    position = present & (nearest == pos_idx)
    d = dist[np.arange(len(pos_idx)), pos_idx]
    margins = shape_margins(feats["fill"], feats["top"])  # (B, 3)
    margin = margins[np.arange(len(shape_idx)), shape_idx]
    shape = present & (margin > 0)
    f32 = np.float32
    scores = {
        "colour": present.astype(f32),
        "position": position.astype(f32),
        "shape": shape.astype(f32),
        "colour_c": np.where(present, feats["pixels"] / np.maximum(feats["foreground"], 1), 0).astype(f32),
        "position_c": np.where(present, np.exp(-(np.nan_to_num(d) ** 2) / (2 * POSITION_SIGMA**2)), 0).astype(
            f32
        ),
        "shape_c": np.where(present, np.clip(np.nan_to_num(margin) / SHAPE_MARGIN_SCALE, -1, 1), -1).astype(
            f32
        ),
    }
    return {k: torch.from_numpy(v) for k, v in scores.items()}


def _check_prompts_vocab(**options: object) -> None:
    if options:
        from .registry import RewardConfigError

        raise RewardConfigError(f"reward shapes: takes no options, got {', '.join(options)}")


class ShapesVerifier:
    """``shapes``: mean of colour-present, position-right and shape-right, in {0, ⅓, ⅔, 1}. (B,) float32."""

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        s = component_scores(images, prompts)
        return (s["colour"] + s["position"] + s["shape"]) / 3


class ShapesDense:
    """``shapes-dense``: verifier + 0.5·shape_c + 0.1·colour_c + 0.1·position_c. (B,) float32."""

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        s = component_scores(images, prompts)
        verifier = (s["colour"] + s["position"] + s["shape"]) / 3
        return verifier + 0.5 * s["shape_c"] + 0.1 * s["colour_c"] + 0.1 * s["position_c"]


@register_reward(
    "shapes",
    check=_check_prompts_vocab,
    help="tiny-shapes verifier: mean of colour present, position right, shape right (0..1)",
)
def build_shapes() -> ShapesVerifier:
    return ShapesVerifier()


@register_reward(
    "shapes-dense",
    check=_check_prompts_vocab,
    help="shapes verifier + 0.5·shape margin + 0.1·colour share + 0.1·position closeness (−0.5..1.7)",
)
def build_shapes_dense() -> ShapesDense:
    return ShapesDense()

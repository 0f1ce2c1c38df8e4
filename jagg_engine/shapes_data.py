"""Procedural data for the `tiny-shapes` backbone: one coloured shape on black, with a 3-word caption.

Images are 32×32 RGB, black background, one shape (circle, square, upright triangle) in one of 6 colours at
one of 5 anchor positions, with ±2 px position jitter, half-size 4–6 px, colour jitter ±15 per channel and
4× supersampled (anti-aliased) edges. The caption is "colour shape position", e.g. "red circle left".

Notation:
    (cx, cy)  shape centre in pixels (x to the right, y down), jittered around the anchor
    r         half-size in pixels: circle radius, square half-side, triangle half-base (height 2r)

Everything here is numpy only (no model code); :func:`render` makes ~thousands of images a second.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

IMAGE_SIZE = 32
SUPERSAMPLE = 4
POSITION_JITTER = 2.0  # pixels, uniform in [−j, j] on each axis
HALF_SIZE_RANGE = (4.0, 6.0)  # pixels
COLOUR_JITTER = 15  # per channel, uniform integer in [−j, j]

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 35, 35),
    "green": (35, 200, 35),
    "blue": (40, 70, 230),
    "yellow": (220, 215, 35),
    "magenta": (215, 35, 215),
    "cyan": (35, 205, 215),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
# Anchors as fractions of the image side, (x, y) with y down.
POSITIONS: dict[str, tuple[float, float]] = {
    "left": (0.25, 0.5),
    "right": (0.75, 0.5),
    "top": (0.5, 0.25),
    "bottom": (0.5, 0.75),
    "center": (0.5, 0.5),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)
POSITION_NAMES: tuple[str, ...] = tuple(POSITIONS)
# The closed vocabulary, in a fixed order (the token ids of the tiny-shapes text embedding).
VOCABULARY: tuple[str, ...] = COLOUR_NAMES + SHAPES + POSITION_NAMES


# The tiny-shapes model the repository ships (its weights, text embedding and vocab.json), and the caption length.
DEFAULT_WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "assets" / "tiny-shapes"
TEXT_LEN = 3


def check_words(prompts: Sequence[str], vocabulary: Sequence[str]) -> None:
    """ValueError in one line for the first prompt of more than :data:`TEXT_LEN` words or with a word outside
    ``vocabulary`` (the tiny-shapes text encoder's closed vocabulary); the empty prompt passes (null caption)."""
    known = set(vocabulary)
    for p in prompts:
        words = p.split()
        if len(words) > TEXT_LEN:
            raise ValueError(f"tiny-shapes: a prompt has at most {TEXT_LEN} words, got {p!r}")
        for w in words:
            if w not in known:
                raise ValueError(
                    f"tiny-shapes: unknown word {w!r} in prompt {p!r}; vocabulary: {' '.join(vocabulary)}"
                )


def model_vocabulary(directory: str | Path) -> list[str] | None:
    """The vocabulary a tiny-shapes model folder's ``vocab.json`` lists; None where it cannot be read."""
    try:
        vocab = json.loads((Path(directory) / "vocab.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    words = vocab.get("vocabulary") if isinstance(vocab, dict) else None
    return [str(w) for w in words] if isinstance(words, list) else None


class Spec(NamedTuple):
    """What one caption asks for."""

    colour: str
    shape: str
    position: str


def all_prompts() -> list[str]:
    """The 90 captions "colour shape position", in a fixed order (colour-major, then shape, then position)."""
    return [f"{c} {s} {p}" for c in COLOUR_NAMES for s in SHAPES for p in POSITION_NAMES]


def parse_prompt(prompt: str) -> Spec:
    """Split a caption into (colour, shape, position); raises ValueError naming the offending word."""
    words = prompt.split()
    if len(words) != 3:
        raise ValueError(f"tiny-shapes: a prompt is 3 words 'colour shape position', got {prompt!r}")
    colour, shape, position = words
    for word, allowed, what in (
        (colour, COLOUR_NAMES, "colour"),
        (shape, SHAPES, "shape"),
        (position, POSITION_NAMES, "position"),
    ):
        if word not in allowed:
            raise ValueError(
                f"tiny-shapes: unknown {what} {word!r} in prompt {prompt!r}; allowed: {', '.join(allowed)}"
            )
    return Spec(colour, shape, position)


def sample_prompts(n: int, seed: int | np.random.Generator = 0) -> list[str]:
    """``n`` captions drawn uniformly (with replacement) from the 90 combinations, reproducibly."""
    rng = np.random.default_rng(seed)
    prompts = all_prompts()
    return [prompts[i] for i in rng.integers(0, len(prompts), size=n)]


def _coverage(shape_idx: np.ndarray, cx: np.ndarray, cy: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Anti-aliased coverage (B, H, W) in [0, 1] of each shape, by 4× supersampling of the pixel grid."""
    s = SUPERSAMPLE
    coords = (np.arange(IMAGE_SIZE * s, dtype=np.float32) + 0.5) / s  # sub-pixel centres, in pixels
    x = coords[None, None, :]  # (1, 1, Hs)
    y = coords[None, :, None]  # (1, Hs, 1)
    cx, cy, r = (a.astype(np.float32)[:, None, None] for a in (cx, cy, r))  # (B, 1, 1)
    dx, dy = x - cx, y - cy  # (B, Hs, Hs) by broadcasting
    circle = dx * dx + dy * dy <= r * r
    square = (np.abs(dx) <= r) & (np.abs(dy) <= r)
    # Upright triangle: apex (cx, cy − r), base from (cx − r, cy + r) to (cx + r, cy + r).
    triangle = (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
    kind = shape_idx[:, None, None]
    inside = np.where(kind == 0, circle, np.where(kind == 1, square, triangle))  # (B, Hs, Hs)
    b = inside.shape[0]
    return inside.reshape(b, IMAGE_SIZE, s, IMAGE_SIZE, s).mean(axis=(2, 4), dtype=np.float32)  # (B, H, W)


def render(prompts: Sequence[str], seed: int | np.random.Generator = 0) -> np.ndarray:
    """Images for ``prompts``: uint8 (B, 32, 32, 3), each with fresh jitter drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    specs = [parse_prompt(p) for p in prompts]
    b = len(specs)
    shape_idx = np.array([SHAPES.index(s.shape) for s in specs])
    anchors = np.array([POSITIONS[s.position] for s in specs], dtype=np.float32) * IMAGE_SIZE  # (B, 2)
    jitter = rng.uniform(-POSITION_JITTER, POSITION_JITTER, size=(b, 2))
    r = rng.uniform(*HALF_SIZE_RANGE, size=b)
    alpha = _coverage(shape_idx, anchors[:, 0] + jitter[:, 0], anchors[:, 1] + jitter[:, 1], r)  # (B, H, W)
    base = np.array([COLOURS[s.colour] for s in specs], dtype=np.float32)  # (B, 3)
    colour = np.clip(base + rng.integers(-COLOUR_JITTER, COLOUR_JITTER + 1, size=(b, 3)), 0, 255)
    img = alpha[..., None] * colour[:, None, None, :]  # (B, H, W, 3)
    return np.round(img).astype(np.uint8)


def batch(n: int, seed: int | np.random.Generator = 0) -> tuple[np.ndarray, list[str]]:
    """A training batch: uint8 images (n, 32, 32, 3) and their captions, both drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    prompts = sample_prompts(n, rng)
    return render(prompts, rng), prompts


def to_unit_range(images: np.ndarray) -> np.ndarray:
    """uint8 (B, H, W, 3) → float32 in [−1, 1], the pixel space the tiny-shapes model works in."""
    return images.astype(np.float32) / 127.5 - 1.0

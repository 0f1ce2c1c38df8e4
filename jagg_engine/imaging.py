"""Image grids: uint8 images laid out as one picture (numpy only, no model, no torch).

Shared by ``jagg eval`` (its grid.png), ``jagg export-model`` (the model card's before_after.png) and
``jagg eval --run``; it sits below both so that neither imports the other for it.
"""

from __future__ import annotations

import numpy as np


def image_grid(images: np.ndarray, columns: int, scale: int, gap: int = 2) -> np.ndarray:
    """uint8 images (N, H, W, 3) → one uint8 grid image, nearest-neighbour upscaled by ``scale``."""
    n, h, w, _ = images.shape
    big = images.repeat(scale, axis=1).repeat(scale, axis=2)  # (N, sH, sW, 3)
    rows = -(-n // columns)
    cell_h, cell_w = h * scale + gap, w * scale + gap
    grid = np.full((rows * cell_h + gap, columns * cell_w + gap, 3), 255, dtype=np.uint8)
    for i in range(n):
        r, c = divmod(i, columns)
        grid[
            gap + r * cell_h : gap + r * cell_h + h * scale, gap + c * cell_w : gap + c * cell_w + w * scale
        ] = big[i]
    return grid

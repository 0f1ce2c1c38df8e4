"""The `shapes` verifier and `shapes-dense`: clean data, noise, hand-built images, registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jagg_engine import shapes_data as sd
from jagg_engine.rewards import shapes as S
from jagg_engine.rewards.registry import RewardConfigError, available_rewards, build_reward, check_reward


def _canvas() -> np.ndarray:
    return np.zeros((32, 32, 3), dtype=np.uint8)


def _square(cx: int, cy: int, r: int, rgb: tuple[int, int, int]) -> np.ndarray:
    img = _canvas()
    img[cy - r : cy + r, cx - r : cx + r] = rgb
    return img


def _antialiased(inside, rgb: tuple[int, int, int]) -> np.ndarray:
    """Render inside(x, y) (pixel units) with 4× supersampling, like the data."""
    y, x = (np.mgrid[0:128, 0:128] + 0.5) / 4
    cover = inside(x, y).reshape(32, 4, 32, 4).mean(axis=(1, 3))  # (32, 32)
    return np.round(cover[..., None] * np.array(rgb)).astype(np.uint8)


def _circle(cx: float, cy: float, r: float, rgb: tuple[int, int, int]) -> np.ndarray:
    return _antialiased(lambda x, y: (x - cx) ** 2 + (y - cy) ** 2 <= r * r, rgb)


def _triangle(cx: float, cy: float, r: float, rgb: tuple[int, int, int]) -> np.ndarray:
    return _antialiased(lambda x, y: (y - cy <= r) & (np.abs(x - cx) <= (y - cy + r) / 2), rgb)


def _score(name: str, images: list[np.ndarray], prompts: list[str]) -> torch.Tensor:
    return build_reward(name)(torch.from_numpy(np.stack(images)), prompts)


def test_registered_and_no_options() -> None:
    assert {"shapes", "shapes-dense"} <= set(available_rewards())
    with pytest.raises(RewardConfigError, match="no options"):
        check_reward("shapes", threshold=1)


def test_hand_built_images_get_the_expected_checks() -> None:
    red, blue = (230, 20, 20), (30, 60, 240)
    images = [
        _square(8, 16, 5, red),  # right everything
        _circle(16, 8, 5.5, blue),  # right everything
        _triangle(16, 16, 6, red),  # right everything
        _square(24, 16, 5, red),  # right colour and shape, wrong position
        _circle(8, 16, 5.5, red),  # right colour and position, wrong shape (asked: square)
        _square(8, 16, 5, blue),  # colour absent → 0 for everything
        _triangle(16, 24, 5, red),  # triangle asked to be a circle at the bottom
    ]
    prompts = [
        "red square left",
        "blue circle top",
        "red triangle center",
        "red square left",
        "red square left",
        "red square left",
        "red circle bottom",
    ]
    parts = S.component_scores(torch.from_numpy(np.stack(images)), prompts)
    torch.testing.assert_close(parts["colour"], torch.tensor([1.0, 1, 1, 1, 1, 0, 1]))
    torch.testing.assert_close(parts["position"], torch.tensor([1.0, 1, 1, 0, 1, 0, 1]))
    torch.testing.assert_close(parts["shape"], torch.tensor([1.0, 1, 1, 1, 0, 0, 0]))
    plain = _score("shapes", images, prompts)
    torch.testing.assert_close(plain, (parts["colour"] + parts["position"] + parts["shape"]) / 3)
    dense = _score("shapes-dense", images, prompts)
    # the dense reward keeps the verifier's order between a fully right image and partly right ones
    assert dense[0] > dense[3] > dense[5] and dense[0] > dense[4] > dense[5]
    assert dense[5] < 0  # nothing of the asked colour: shape_c = −1


def test_dense_margin_grows_towards_the_asked_shape() -> None:
    red = (230, 20, 20)
    # a square with ever more rounded corners: the "square" margin falls, the "circle" one rises
    squares = []
    for rounding in (0.0, 2.0, 4.0):
        img = _square(16, 16, 6, red)
        y, x = np.mgrid[0:32, 0:32] + 0.5
        corner = (
            np.maximum(np.abs(x - 16) - (6 - rounding), 0) ** 2
            + np.maximum(np.abs(y - 16) - (6 - rounding), 0) ** 2
        )
        img[corner > rounding**2] = 0
        squares.append(img)
    as_square = S.component_scores(torch.from_numpy(np.stack(squares)), ["red square center"] * 3)["shape_c"]
    as_circle = S.component_scores(torch.from_numpy(np.stack(squares)), ["red circle center"] * 3)["shape_c"]
    assert as_square[0] > as_square[1] > as_square[2]
    assert as_circle[0] < as_circle[1] < as_circle[2]


def test_clean_data_accuracy_and_noise() -> None:
    images, prompts = sd.batch(360, seed=2024)
    parts = S.component_scores(torch.from_numpy(images), prompts)
    for k in ("colour", "position", "shape"):
        assert parts[k].mean() >= 0.95, k
    assert _score("shapes", list(images), prompts).mean() >= 0.95
    g = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 256, (120, 32, 32, 3), dtype=torch.uint8, generator=g)
    assert build_reward("shapes")(noise, prompts[:120]).mean() <= 0.02


def test_black_image_scores_zero_and_bad_input_raises() -> None:
    black = torch.zeros(2, 32, 32, 3, dtype=torch.uint8)
    assert build_reward("shapes")(black, ["red circle left", "cyan square top"]).sum() == 0
    with pytest.raises(ValueError, match="prompts"):
        build_reward("shapes")(black, ["red circle left"])
    with pytest.raises(ValueError, match="unknown shape"):
        build_reward("shapes")(black, ["red dog left", "red circle top"])


def test_connected_components_labels() -> None:
    mask = torch.zeros(1, 6, 6, dtype=torch.bool)
    mask[0, 0, 0] = mask[0, 1, 1] = True  # diagonal neighbours: one component (8-connected)
    mask[0, 4:6, 4:6] = True
    labels = S.connected_components(mask)[0]
    assert labels[0, 0] == labels[1, 1] == 0
    assert (labels[4:6, 4:6] == 4 * 6 + 4).all()
    assert (labels[~mask[0]] == -1).all()

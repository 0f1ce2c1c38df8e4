"""Procedural shapes data: vocabulary, prompts, rendering geometry and determinism."""

from __future__ import annotations

import numpy as np
import pytest

from jagg_engine import shapes_data as sd


def test_all_prompts_are_the_90_distinct_combinations() -> None:
    prompts = sd.all_prompts()
    assert len(prompts) == 90 == len(set(prompts))
    assert "red circle left" in prompts
    for p in prompts:
        spec = sd.parse_prompt(p)
        assert spec.colour in sd.COLOURS and spec.shape in sd.SHAPES and spec.position in sd.POSITIONS
    assert set(sd.VOCABULARY) == {w for p in prompts for w in p.split()}


@pytest.mark.parametrize("bad", ["red dog left", "red circle", "purple circle left", "red circle middle"])
def test_parse_prompt_rejects_bad_captions(bad: str) -> None:
    with pytest.raises(ValueError, match="tiny-shapes"):
        sd.parse_prompt(bad)


def test_sample_prompts_is_seeded() -> None:
    assert sd.sample_prompts(20, seed=3) == sd.sample_prompts(20, seed=3)
    assert sd.sample_prompts(20, seed=3) != sd.sample_prompts(20, seed=4)
    assert set(sd.sample_prompts(2000, seed=0)) == set(sd.all_prompts())


def test_render_colour_position_and_area() -> None:
    prompts = ["red square left", "blue circle top", "green triangle center"]
    images = sd.render(prompts, seed=0)
    assert images.shape == (3, 32, 32, 3) and images.dtype == np.uint8
    assert (images[:, 0, 0] == 0).all()  # black background in the corner
    for img, p in zip(images, prompts):
        spec = sd.parse_prompt(p)
        alpha = img.max(axis=-1) / img.max()  # coverage, relative to the jittered colour
        ys, xs = np.nonzero(alpha > 0.5)
        ax, ay = (np.array(sd.POSITIONS[spec.position]) * 32).tolist()
        # the box centre is within the ±2 px jitter (plus half a pixel of rasterisation) of the anchor
        assert (
            abs((xs.min() + xs.max() + 1) / 2 - ax) <= 2.5 and abs((ys.min() + ys.max() + 1) / 2 - ay) <= 2.5
        )
        bright = img[alpha > 0.9].mean(axis=0)
        assert np.argmax(bright) == int(np.argmax(sd.COLOURS[spec.colour]))
    # area ratios follow the geometry: square (2r)² > circle πr² > triangle 2r² for the same r range
    many = sd.render(
        ["red square center"] * 50 + ["red circle center"] * 50 + ["red triangle center"] * 50, seed=1
    )
    area = (many.max(axis=-1) / 255.0).reshape(3, 50, -1).sum(-1).mean(-1)
    assert area[0] > area[1] > area[2]
    np.testing.assert_allclose(area[1] / area[0], np.pi / 4, rtol=0.1)
    np.testing.assert_allclose(area[2] / area[0], 0.5, rtol=0.1)


def test_batch_is_deterministic_and_in_range() -> None:
    a, pa = sd.batch(16, seed=5)
    b, pb = sd.batch(16, seed=5)
    assert pa == pb and np.array_equal(a, b)
    x = sd.to_unit_range(a)
    assert x.dtype == np.float32 and x.min() >= -1.0 and x.max() <= 1.0

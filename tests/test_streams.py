"""jagg_engine.streams: every stream (seed, index, rank, purpose) independent of every other, the same after a
resume (in a fresh process too), and bad names or numbers refused naming the field. Written over ``PURPOSES``:
a purpose added later is checked by every test here without an edit.

Independence is read from N = 10 000 draws a stream: the correlation of two independent streams has standard
error 1/√N = 0.01, and the bound is 6/√N = 0.06 (odds of 2e-9 a pair, and the seeds are fixed); a copied
stream, or one mixed 0.15 into another, is far over it. Copies shifted by some draws, which no correlation of
aligned draws sees, are caught by the draws themselves: no double drawn by one stream is drawn by another.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from jagg_engine.streams import PURPOSES, numpy_stream, stream_seed, torch_stream

N = 10_000
BOUND = 6 / math.sqrt(N)
# (seed, index, rank): a base, each field moved by one, fields swapped, and values past 32 bits
COORDS = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (7, 3, 1), (3, 7, 1), (2**40, 2**33, 5)]
# The seeds of the purposes the product shipped first, at (7, 3, 1): a stream's seed never changes, so a run
# resumed by a later version (with more purposes) draws what it drew before.
SHIPPED = {
    "init_noise": 1582634222204544278,
    "sde_noise": 3841002042842050097,
    "prompts": 6372569074875380231,
    "minibatch": 6618012450015962491,
    "window": 12816861800586137769,
}


def every_stream() -> list[tuple[int, int, int, str]]:
    return [(*c, p) for c in COORDS for p in PURPOSES]


def draws(stream: tuple[int, int, int, str]) -> dict[str, np.ndarray]:
    """N standard normal draws of the stream's torch generator and of its numpy generator."""
    t = torch.randn(N, generator=torch_stream(*stream), dtype=torch.float64).numpy()
    return {"torch": t, "numpy": numpy_stream(*stream).standard_normal(N)}


def dependent_pairs(samples: dict) -> list[tuple]:
    """The pairs of ``samples`` (name → N draws) over the bound, and those that share a drawn value."""
    names = list(samples)
    x = np.stack([samples[k] for k in names])  # (M, N)
    z = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
    c = z @ z.T / N  # (M, M) correlations
    M = len(names)
    over = [(names[k], names[i], float(c[i, k])) for i in range(M) for k in range(i) if abs(c[i, k]) >= BOUND]
    values, owners = x.flatten(), np.repeat(np.arange(M), N)
    order = np.argsort(values, kind="stable")
    values, owners = values[order], owners[order]
    same = (values[1:] == values[:-1]) & (owners[1:] != owners[:-1])
    shared = {tuple(sorted((int(a), int(b)))) for a, b in zip(owners[:-1][same], owners[1:][same])}
    return over + [(names[k], names[i], "shared draw") for k, i in sorted(shared)]


@pytest.fixture(scope="module")
def samples() -> dict:
    return {(*s, lib): v for s in every_stream() for lib, v in draws(s).items()}


def test_every_stream_is_independent_of_every_other(samples):
    """Every purpose against every other, and against itself at another seed, step (index) or rank, and the
    torch generator against the numpy one: no pair correlates over 6/√N, none shares a draw."""
    assert len({s[:4] for s in samples}) == len(PURPOSES) * len(COORDS)
    assert len({stream_seed(*s) for s in every_stream()}) == len(every_stream())
    assert dependent_pairs(samples) == []
    for v in samples.values():  # each is N(0, 1)
        assert abs(v.mean()) < 6 / math.sqrt(N) and abs(v.std() - 1) < 6 / math.sqrt(2 * N)


def test_the_checks_catch_copied_shifted_and_mixed_streams():
    """What the streams are there to prevent fails the checks above: the SDE noise drawn from a generator
    seeded like the initial noise's (the same draws), a stream shifted by 7 draws, one mixed 0.15 into another."""
    init, sde = draws((0, 1, 0, "init_noise"))["torch"], draws((0, 1, 0, "sde_noise"))["torch"]
    assert dependent_pairs({"init": init, "sde": sde}) == []
    alike = [torch.Generator().manual_seed(5) for _ in range(2)]
    same = [torch.randn(N, generator=g, dtype=torch.float64).numpy() for g in alike]
    found = dependent_pairs({"init": same[0], "sde": same[1]})
    assert found == [("init", "sde", pytest.approx(1.0)), ("init", "sde", "shared draw")]
    assert dependent_pairs({"init": init, "shifted": np.roll(init, 7)}) == [
        ("init", "shifted", "shared draw")
    ]
    mixed = 0.15 * init + math.sqrt(1 - 0.15**2) * sde
    ((_, _, c),) = dependent_pairs({"init": init, "mixed": mixed})
    assert c > BOUND


def test_a_stream_is_the_same_after_a_resume():
    """A stream's draws depend on (seed, index, rank, purpose) only: not on the streams drawn before it, on the
    global torch and numpy states (which it leaves as they were), or on the purposes listed; the shipped
    purposes keep their seeds."""
    first = {s: draws(s) for s in every_stream()}
    torch.manual_seed(123)
    np.random.seed(5)
    state, np_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    for s in reversed(every_stream()):
        again = draws(s)
        assert all(np.array_equal(first[s][lib], again[lib]) for lib in again), s
    assert torch.equal(torch.get_rng_state(), state) and np.array_equal(np.random.get_state()[1], np_state)
    assert {p: stream_seed(7, 3, 1, p) for p in SHIPPED} == SHIPPED
    assert stream_seed(np.int64(7), np.int64(3), 1, "window") == SHIPPED["window"]


FRESH = """
import json, sys, torch
from jagg_engine.streams import PURPOSES, numpy_stream, stream_seed, torch_stream
out = {}
for s in json.loads(sys.argv[1])[::-1]:
    out[repr(s)] = [stream_seed(*s), torch.randn(4, generator=torch_stream(*s), dtype=torch.float64).tolist(),
                    numpy_stream(*s).standard_normal(4).tolist()]
print(json.dumps({"purposes": list(PURPOSES), "draws": out}))
"""


def test_a_stream_is_the_same_in_a_fresh_process():
    """A resumed run is another process: another hash seed, streams asked for in another order, the same draws."""
    streams = [list(s) for s in every_stream()]
    env = {**os.environ, "PYTHONHASHSEED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH, json.dumps(streams)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    fresh = json.loads(proc.stdout)
    assert fresh["purposes"] == list(PURPOSES)
    for s in streams:
        want = [
            stream_seed(*s),
            torch.randn(4, generator=torch_stream(*s), dtype=torch.float64).tolist(),
            numpy_stream(*s).standard_normal(4).tolist(),
        ]
        assert fresh["draws"][repr(s)] == want, s


BAD = [
    ({"seed": -1}, "seed: must be an integer >= 0, got -1"),
    ({"index": -2}, "index: must be an integer >= 0, got -2"),
    ({"rank": -1}, "rank: must be an integer >= 0, got -1"),
    ({"seed": 1.5}, "seed: must be an integer >= 0, got 1.5"),  # not rounded into seed 1's stream
    ({"index": None}, "index: must be an integer >= 0, got None"),
    ({"rank": "0"}, "rank: must be an integer >= 0, got '0'"),
    ({"seed": True}, "seed: must be an integer >= 0, got True"),
    ({"purpose": "noise"}, f"purpose: must be one of {', '.join(PURPOSES)}, got 'noise'"),
    ({"purpose": None}, f"purpose: must be one of {', '.join(PURPOSES)}, got None"),
    ({"purpose": ["window"]}, f"purpose: must be one of {', '.join(PURPOSES)}, got ['window']"),
]


@pytest.mark.parametrize("make", [stream_seed, torch_stream, numpy_stream], ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad, message", BAD, ids=[f"{k}={v!r}" for b, _ in BAD for k, v in b.items()])
def test_bad_inputs_are_refused_naming_the_field(make, bad, message):
    args = {"seed": 0, "index": 1, "rank": 0, "purpose": PURPOSES[0], **bad}
    with pytest.raises(ValueError) as info:
        make(**args)
    assert str(info.value) == message and "\n" not in message

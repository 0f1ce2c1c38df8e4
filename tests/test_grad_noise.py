"""scripts/grad_noise.py: each variant's mean ‖g‖² as a multiple of the baseline's on the same seed, read from a
committed race's history/ and checked against the same figure computed straight from the gzipped records."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RACE = REPO / "reports" / "race" / "tiny-shapes-mix-s2"


def raw_mean_square(run: str) -> float:
    norms = []
    with gzip.open(RACE / "history" / run / "history.jsonl.gz", "rt") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["kind"] == "metrics" and rec["step"] > 0 and "grad/norm" in rec["values"]:
                norms.append(rec["values"]["grad/norm"] ** 2)
    return sum(norms) / len(norms)


def grad_noise(*args: str) -> subprocess.CompletedProcess:
    """The script over the committed race, as a person runs it."""
    cmd = [sys.executable, "scripts/grad_noise.py", str(RACE), *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)


def test_the_ratio_of_mean_square_gradient_norms_per_seed():
    proc = grad_noise("--baseline", "mix50")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines()[2:]}
    names = {json.loads((d / "run.json").read_text())["name"]: d.name for d in (RACE / "history").iterdir()}
    expected = raw_mean_square(names["mix75-seed2"]) / raw_mean_square(names["mix50-seed2"])
    assert expected > 1.05  # the two differ, so the ratio is not 1 by construction
    assert rows["mix75"].split("|")[2].strip() == f"{expected:.2f}"
    assert rows["mix50"].split("|")[2].strip() == "1.00"


def test_an_unknown_baseline_is_one_line():
    proc = grad_noise("--baseline", "nope")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "--baseline: no variant 'nope' in these races (have mix50, mix75)"

"""Is JAGG's plateau on mode-toy a step-size effect? The instrument: how far each optimizer step moves the weights.

    python scripts/plateau_step_size.py --out reports/plateau-step-size     # ~4 min alone on one core

reports/race/plateau-toy found that JAGG on ``configs/mode-toy.yaml`` behaves like the exact backward at 1.4× the
learning rate (ahead early, below late) and that JAGG at 0.7× ends level with exact. If that is a step-size
effect, JAGG's optimizer steps must be *longer* than exact's at the same learning rate (with AdamW, a gradient
that is more consistent from step to step makes m/√v larger), or more aligned with each other, so that the
weights travel further. This script trains the race's setting (the real :class:`Trainer`, 300 steps, lr 5e-4)
for ``exact``, ``jagg``, ``exact-lr7`` (exact at 7e-4) and ``jagg-lr35`` (JAGG at 3.5e-4) and records, at every
optimizer step:

- ``step_rms``: the weights' change ‖Δθ‖ / (lr · √n), the AdamW step in units of the learning rate (1 = every
  coordinate moved by lr);
- ``grad_cos``: the cosine between this step's (clipped) gradient and the previous step's;
- ``travel``: ‖θ_t − θ_0‖, the distance from the initial weights.

The predictions that can fail: JAGG's ``travel`` at step 100 exceeds exact's by about exact-lr7's factor (~1.4),
and JAGG at 0.35 brings it back to exact's. Writes ``<out>/step_size.json`` and ``<out>/README.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jagg_engine.store import open_store  # noqa: E402
from jagg_engine.train.config import load_config  # noqa: E402
from jagg_engine.train.trainer import Trainer  # noqa: E402

CONFIG = REPO / "configs" / "mode-toy.yaml"
BASE = ["steps=300", "eval_every=20"]
VARIANTS = {
    "exact": ["strategy=exact", "lr=5e-4"],
    "jagg": ["strategy=jagg", "lr=5e-4"],
    "exact-lr7": ["strategy=exact", "lr=7e-4"],
    "jagg-lr35": ["strategy=jagg", "lr=3.5e-4"],
}
SPANS = ((1, 20), (21, 60), (61, 100), (101, 200), (201, 300))
AT = (20, 60, 100, 200, 300)


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def train(variant: str, seed: int, out: Path) -> dict[str, Any]:
    """One run; per optimizer step its step_rms, grad_cos and travel, and its eval curve."""
    cfg = load_config(
        str(CONFIG), [*VARIANTS[variant], *BASE, f"seed={seed}", f"name={variant}-seed{seed}"],
        check_environment=False,
    )  # fmt: skip
    store = open_store(out)
    run_dir = out / f"{variant}-seed{seed}"
    run_id = store.create_run(cfg.name, cfg.to_dict(), run_dir)
    trainer = Trainer(cfg, run_id, str(out), run_dir=run_dir)
    params = [p for p in trainer.params if p.requires_grad]
    start = flat(params)
    rows: list[dict[str, float]] = []
    previous: list[torch.Tensor | None] = [None]
    step_fn = trainer.optimizer.step

    def measured_step(*args: Any, **kwargs: Any) -> Any:
        before = flat(params)
        grad = flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
        out_ = step_fn(*args, **kwargs)
        after = flat(params)
        lr = trainer.optimizer.param_groups[0]["lr"]
        cos = (
            float(torch.nn.functional.cosine_similarity(grad, previous[0], dim=0))
            if previous[0] is not None
            else float("nan")
        )
        previous[0] = grad
        rows.append(
            {
                "step_rms": float((after - before).norm() / (lr * after.numel() ** 0.5)),
                "grad_cos": cos,
                "travel": float((after - start).norm()),
            }
        )
        return out_

    trainer.optimizer.step = measured_step  # type: ignore[method-assign]
    trainer.run()
    frame = store.metric_series(run_id, ["eval/reward/mean"]).dropna()
    evals = {int(k): float(v) for k, v in zip(frame["step"], frame["eval/reward/mean"])}
    return {"per_step": rows, "eval": evals}


def rounded(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, list):
        return [rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    return x


def mean_se(values: list[float]) -> tuple[float, float]:
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0)


def summary(runs: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant, by_seed in runs.items():
        seeds = sorted(by_seed)
        row: dict[str, Any] = {"step_rms": {}, "grad_cos": {}, "travel": {}, "eval": {}}
        for lo, hi in SPANS:
            span = f"{lo}-{hi}"
            for key in ("step_rms", "grad_cos"):
                per_seed = []
                for s in seeds:
                    vals = [r[key] for r in by_seed[s]["per_step"][lo - 1 : hi] if r[key] == r[key]]
                    per_seed.append(statistics.fmean(vals))
                row[key][span] = mean_se(per_seed)
        for step in AT:
            row["travel"][step] = mean_se([by_seed[s]["per_step"][step - 1]["travel"] for s in seeds])
            row["eval"][step] = mean_se([by_seed[s]["eval"][step] for s in seeds])
        out[variant] = row
    return out


def write_readme(out: Path, report: dict[str, Any]) -> None:
    s = report["summary"]
    spans = [f"{lo}-{hi}" for lo, hi in SPANS]

    def cell(pair: list[float] | tuple[float, float], fmt: str) -> str:
        return f"{pair[0]:{fmt}} ± {pair[1]:{fmt}}"

    def span_table(key: str) -> list[str]:
        """A table of ``key`` per span of training steps, a row per variant."""
        return [
            "| variant | " + " | ".join(f"steps {k}" for k in spans) + " |",
            "|---|" + "---|" * len(spans),
            *[f"| {v} | " + " | ".join(cell(r[key][k], ".3f") for k in spans) + " |" for v, r in s.items()],
        ]

    lines = [
        "# How far JAGG's optimizer steps move the weights on mode-toy (the plateau's step-size reading, measured)",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']}; {report['date']}. Seeds {report['seeds']}; mean ± SE over seeds.",
        "",
        "AdamW's step in units of the learning rate, ‖Δθ‖ / (lr·√n), averaged over each span of training steps:",
        "",
        *span_table("step_rms"),
        "",
        "Cosine between consecutive steps' gradients:",
        "",
        *span_table("grad_cos"),
        "",
        "Distance from the initial weights, ‖θ_t − θ_0‖, and the eval reward:",
        "",
        "| variant | "
        + " | ".join(f"travel @{k}" for k in AT)
        + " | "
        + " | ".join(f"eval @{k}" for k in AT)
        + " |",
        "|---|" + "---|" * (2 * len(AT)),
        *[
            f"| {v} | "
            + " | ".join(cell(r["travel"][str(k)], ".3f") for k in AT)
            + " | "
            + " | ".join(f"{r['eval'][str(k)][0]:.3f}" for k in AT)
            + " |"
            for v, r in s.items()
        ],
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, default=REPO / "reports" / "plateau-step-size")
    args = p.parse_args()
    torch.set_num_threads(1)
    seeds = [int(x) for x in args.seeds.split(",")]
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: --variants: allowed {', '.join(VARIANTS)}; got {args.variants}")
    runs: dict[str, dict[int, dict[str, Any]]] = {v: {} for v in variants}
    with tempfile.TemporaryDirectory(prefix="plateau-step-size-") as tmp:
        for seed in seeds:
            for v in variants:
                t0 = time.time()
                runs[v][seed] = train(v, seed, Path(tmp))
                last = runs[v][seed]["per_step"][-1]
                print(f"{v} seed {seed}: travel {last['travel']:.3f} ({time.time() - t0:.0f} s)", flush=True)
    report = {
        "command": "python scripts/plateau_step_size.py"
        + (f" --seeds {args.seeds}" if args.seeds != "0,1,2,3,4,5,6,7,8,9" else "")
        + (f" --variants {args.variants}" if args.variants != ",".join(VARIANTS) else "")
        + f" --out {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}",
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seeds": ", ".join(map(str, seeds)),
        "summary": summary(runs),
        "runs": {v: {str(s): r for s, r in by.items()} for v, by in runs.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    report["runs"] = rounded(report["runs"])  # per-step rows to 6 significant digits, compact: ~0.7 MB
    (args.out / "step_size.json").write_text(
        json.dumps(report, separators=(",", ":")) + "\n", encoding="utf-8"
    )
    write_readme(args.out, json.loads(json.dumps(report)))
    print(f"wrote {args.out / 'README.md'}")


if __name__ == "__main__":
    main()

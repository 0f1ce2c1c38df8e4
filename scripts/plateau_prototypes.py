"""Two estimators at JAGG's cost tried on the plateau's reproduction (`mode-toy`), as research prototypes.

    python scripts/plateau_prototypes.py --out reports/plateau-prototypes     # ~15 min on one core

Neither is in the engine: each replaces :meth:`jagg_engine.jagg.UpdateState.jagg_group` in this process only
(``policy_update`` then runs it on every JAGG group), and the runs are the real :class:`Trainer` on
``configs/mode-toy.yaml`` (300 steps, lr 5e-4, eval every 20), the setting of reports/race/plateau-toy, whose
exact and JAGG runs this script also trains (the same seeds give the same curves as the race's).

- ``zhat``: the far endpoint's Jacobian at the window's state with the injected noise removed,
  ẑ = z_{W−1} − Σ_{k<W−1} (z_{k+1} − μ_k) (μ_k the SDE step's mean), the joint backward J_0ᵀ s_base + J(ẑ)ᵀ s_corr;
  the far endpoint's own credit s_{W−1} lands on J(ẑ) too (no third forward).
- ``exact100-jagg``: the exact backward for the first 100 steps, then JAGG: whether JAGG's late steps, from a
  state the exact backward reached, lose what exact keeps (the reverse of ``jagg_until_step``).
- ``pairs``: unbiased, Horvitz–Thompson: each sample draws 2 of the W steps uniformly without replacement and
  credits each drawn step's own J_jᵀ s_j with weight W/2 (E = Σ_j J_jᵀ s_j): 2 grad forwards per sample and one
  backward, JAGG's cost without needing the rollout's velocities. (The prototype computes every s_j from
  no-grad forwards for simplicity; a product version would forward only what it uses.)

Writes ``<out>/prototypes.json`` and ``<out>/README.md``: per variant the seed-mean eval at steps 100/140/200/300
and its paired difference to exact (± SE, seeds below), and each estimator's gradient against the exact one on
one rollout batch of the base model (cosine, norm ratio).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jagg_engine import jagg as J  # noqa: E402
from jagg_engine.backbones import build_backbone  # noqa: E402
from jagg_engine.credit import aggregate_upstream, jagg_alpha  # noqa: E402
from jagg_engine.sde import SamplerConfig, rollout  # noqa: E402
from jagg_engine.store import open_store  # noqa: E402
from jagg_engine.train.config import load_config  # noqa: E402
from jagg_engine.train.trainer import Trainer  # noqa: E402

CONFIG = REPO / "configs" / "mode-toy.yaml"
OVERRIDES = ["steps=300", "lr=5e-4", "eval_every=20"]
STEPS = (100, 140, 200, 300)
PLAIN_JAGG = J.UpdateState.jagg_group


def zhat_group(state: J.UpdateState, steps: list[int], sequential: bool) -> None:
    first, last = steps[0], steps[-1]
    alpha = jagg_alpha(state.traj.sigmas[steps], state.update.alpha_scale)
    lat, sig = state.traj.latents, state.traj.sigmas
    v = {j: state.forward([j], grad=False) for j in steps}
    z_hat = lat[last]
    for k in steps[:-1]:
        mean = state.sampler.step(v[k], lat[k], k, sig, prev_sample=lat[k + 1]).mean
        z_hat = z_hat - (lat[k + 1] - mean)
    s_base, s_corr = aggregate_upstream(torch.stack([state.upstream(v[j], j) for j in steps]), alpha)
    z = torch.cat([lat[first], z_hat])
    t = torch.cat([state.t(first), state.t(last)])
    out = state.model(z, t, J.cat_cond([state.traj.cond, state.traj.cond]))
    state.backward([out[: state.B], out[state.B :]], [s_base, s_corr])


def pairs_group(state: J.UpdateState, steps: list[int], sequential: bool) -> None:
    W, B = len(steps), state.B
    seed = int(state.traj.latents[steps[0]].abs().sum().item() * 1e3) % (2**31)  # a draw per batch and group
    pick = torch.rand(B, W, generator=torch.Generator().manual_seed(seed)).argsort(dim=1)[:, :2]  # (B, 2)
    rows = [(pick == k).any(dim=1).nonzero().squeeze(1) for k in range(W)]
    s = [state.upstream(state.forward([j], grad=False), j) for j in steps]
    live = [k for k in range(W) if len(rows[k])]
    out = state.forward([steps[k] for k in live], grad=True, rows=[rows[k] for k in live])
    outs, ups, at = [], [], 0
    for k in live:
        n = len(rows[k])
        outs.append(out[at : at + n])
        ups.append((W / 2) * s[k][rows[k]])
        at += n
    state.backward(outs, ups)


def exact_then_jagg(switch: int) -> Any:
    """The exact backward for the first ``switch`` training steps, then JAGG (the reverse of jagg_until_step):
    counts its calls, one a training step in this setting (one group a step, one update a rollout)."""
    calls = [0]

    def group(state: J.UpdateState, steps: list[int], sequential: bool) -> None:
        calls[0] += 1
        if calls[0] <= switch:
            state.exact_group(steps)
        else:
            PLAIN_JAGG(state, steps, sequential)

    return group


VARIANTS: dict[str, tuple[str, Any]] = {
    "exact": ("exact", PLAIN_JAGG),
    "jagg": ("jagg", PLAIN_JAGG),
    "zhat": ("jagg", zhat_group),
    "pairs": ("jagg", pairs_group),
    "exact100-jagg": ("jagg", None),  # a fresh exact_then_jagg(100) for each run
}


def train(variant: str, seed: int, out: Path) -> dict[int, float]:
    strategy, routine = VARIANTS[variant]
    J.UpdateState.jagg_group = routine if routine is not None else exact_then_jagg(100)
    try:
        cfg = load_config(
            str(CONFIG),
            [f"strategy={strategy}", *OVERRIDES, f"seed={seed}", f"name={variant}-seed{seed}"],
            check_environment=False,
        )
        store = open_store(out)
        run_dir = out / f"{variant}-seed{seed}"
        run_id = store.create_run(cfg.name, cfg.to_dict(), run_dir)
        Trainer(cfg, run_id, str(out), run_dir=run_dir).run()
        frame = store.metric_series(run_id, ["eval/reward/mean"]).dropna()
        return {int(k): float(v) for k, v in zip(frame["step"], frame["eval/reward/mean"])}
    finally:
        J.UpdateState.jagg_group = PLAIN_JAGG


def one_batch_cosines() -> dict[str, dict[str, float]]:
    """Each estimator's gradient of one group on one rollout batch of the base model against the exact one."""
    model = build_backbone("mode-toy")
    sampler = SamplerConfig(num_steps=12, eta=0.7, sde_window=(0, 4))
    g = torch.Generator().manual_seed(0)
    cond = model.encode_prompts(model.sample_prompts(128, 0))
    traj = rollout(model, cond, torch.randn(128, 8, generator=g), sampler, generator=g)
    adv = torch.randn(128, generator=g)

    def grad(kind: str, routine: Any) -> torch.Tensor:
        model.zero_grad()
        J.UpdateState.jagg_group = routine
        try:
            J.run_single_group(model, traj, adv, J.UpdateConfig(window=4), sampler, [0, 1, 2, 3], kind)
        finally:
            J.UpdateState.jagg_group = PLAIN_JAGG
        return torch.cat([p.grad.flatten() for p in model.parameters()]).clone()

    exact = grad("exact", PLAIN_JAGG)
    out = {}
    for name in ("jagg", "zhat", "pairs"):  # exact100-jagg is JAGG on one batch
        est = grad("jagg", VARIANTS[name][1])
        out[name] = {
            "cosine": float(est @ exact / (est.norm() * exact.norm())),
            "norm_ratio": float(est.norm() / exact.norm()),
        }
    return out


def summary(curves: dict[str, dict[int, dict[int, float]]]) -> dict[str, Any]:
    seeds = sorted(curves["exact"])
    rows = {}
    for variant, by_seed in curves.items():
        rows[variant] = {}
        for step in STEPS:
            vals = [by_seed[s][step] for s in seeds]
            diff = [by_seed[s][step] - curves["exact"][s][step] for s in seeds]
            se = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else 0.0
            rows[variant][step] = {
                "mean": statistics.fmean(vals),
                "minus_exact": statistics.fmean(diff),
                "se": se,
                "below": sum(d < 0 for d in diff),
            }
    return {"seeds": seeds, "steps": list(STEPS), "rows": rows}


def write_readme(out: Path, report: dict[str, Any]) -> None:
    s, cos = report["summary"], report["one_batch"]
    lines = [
        "# Two estimators at JAGG's cost on the plateau's reproduction (prototypes)",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']}; {report['date']}.",
        "",
        f"`configs/mode-toy.yaml` with {' '.join(OVERRIDES)}, seeds {', '.join(map(str, s['seeds']))}; seed-mean eval "
        "at each step, and the paired difference to exact (± SE over seeds; seeds below exact):",
        "",
        "| variant | " + " | ".join(f"step {k}" for k in s["steps"]) + " |",
        "|---|" + "---|" * len(s["steps"]),
    ]
    for variant, by_step in s["rows"].items():
        cells = []
        for k in s["steps"]:
            c = by_step[str(k)] if str(k) in by_step else by_step[k]
            cells.append(
                f"{c['mean']:.3f}"
                if variant == "exact"
                else f"{c['mean']:.3f} ({c['minus_exact']:+.3f} ± {c['se']:.3f}, {c['below']}/{len(s['seeds'])})"
            )
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "One group (W = 4) on one rollout batch of the base model (128 samples), against the exact gradient:",
        "",
        "| estimator | cosine | norm ratio |",
        "|---|---|---|",
        *[f"| {k} | {v['cosine']:.3f} | {v['norm_ratio']:.3f} |" for k, v in cos.items()],
        "",
        "zhat moves the far endpoint's forward off the far state, and the far endpoint's own credit (the largest of"
        " the window) goes with it. pairs is unbiased; its extra variance (each step's credit counted twice on half"
        " the samples) makes it slower per step.",
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, default=REPO / "reports" / "plateau-prototypes")
    args = p.parse_args()
    torch.set_num_threads(1)
    seeds = [int(x) for x in args.seeds.split(",")]
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or "exact" not in variants:
        raise SystemExit(
            f"error: --variants: needs exact, allowed {', '.join(VARIANTS)}; got {args.variants}"
        )
    curves: dict[str, dict[int, dict[int, float]]] = {v: {} for v in variants}
    with tempfile.TemporaryDirectory(prefix="plateau-prototypes-") as tmp:
        for seed in seeds:
            for v in variants:
                t0 = time.time()
                curves[v][seed] = train(v, seed, Path(tmp))
                print(
                    f"{v} seed {seed}: final {curves[v][seed][STEPS[-1]]:.4f} ({time.time() - t0:.0f} s)",
                    flush=True,
                )
    import platform

    report = {
        "command": "python scripts/plateau_prototypes.py"
        + (f" --seeds {args.seeds}" if args.seeds != "0,1,2,3,4,5,6,7,8,9" else "")
        + (f" --variants {args.variants}" if args.variants != ",".join(VARIANTS) else "")
        + f" --out {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}",
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "summary": summary(curves),
        "one_batch": one_batch_cosines(),
        "curves": curves,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prototypes.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    write_readme(args.out, json.loads(json.dumps(report)))
    print(f"wrote {args.out / 'README.md'}")


if __name__ == "__main__":
    main()

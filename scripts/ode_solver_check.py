"""Outside the SDE window: dpmpp-2m at half the ODE steps against Euler, measured on a config's model.

    python scripts/ode_solver_check.py configs/tiny-shapes-cpu.yaml --windows 0-4,4-8 --prompts 90

For each SDE window, every eval prompt is sampled from its fixed noise (seed 0) with the same SDE noise inside
the window, the steps outside it solved five ways: a reference (Euler at 4× the schedule's own step count on
each ODE part), Euler at the own count n and at n/2, dpmpp-2m at n/2 and at n (``ode_steps_before`` /
``ode_steps_after``; n/2 rounded up). Reported per way: the RMS distance of its final images (decoded, 0–255)
to the reference's, averaged over the prompts, the ODE model calls per sample, and for dpmpp-2m at n/2 the
fraction of prompts on which it is closer to the reference than Euler at n/2. Trailing ``key=value`` apply to
the config (as `jagg train` takes them); ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import torch


def _windows(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.append((int(a), int(b)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="key=value applied to the config")
    p.add_argument("--windows", default=None, help="SDE windows start-end,…; default: the config's own")
    p.add_argument("--prompts", type=int, default=90, help="eval prompts (the first N)")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)

    from jagg_engine.sde import eval_noise, rollout
    from jagg_engine.train.config import load_config
    from jagg_engine.train.trainer import build_model, prompt_source

    cfg = load_config(args.config, args.overrides)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, torch.device("cpu"))
    prompts = prompt_source(cfg, eval_set=True)[: args.prompts]
    noise = torch.stack([eval_noise(model.latent_shape, i, 0) for i in range(len(prompts))])
    with torch.no_grad():
        cond = model.encode_prompts(prompts)
    T = cfg.sampling_steps
    rows = []
    for start, end in _windows(args.windows) if args.windows else [cfg.sde_window()]:
        own = (start, T - end)  # the schedule's ODE steps before / after the window
        half = tuple(math.ceil(n / 2) for n in own)
        ways = {
            "reference (euler 4n)": ("euler", tuple(4 * n for n in own)),
            "euler n": ("euler", own),
            "euler n/2": ("euler", half),
            "dpmpp-2m n/2": ("dpmpp-2m", half),
            "dpmpp-2m n": ("dpmpp-2m", own),
        }
        images = {}
        for name, (solver, (before, after)) in ways.items():
            sampler = dataclasses.replace(
                cfg.sampler_config(),
                sde_window=(start, end),
                ode_solver=solver,
                ode_steps_before=before or None,
                ode_steps_after=after or None,
            )
            g = torch.Generator().manual_seed(cfg.seed)
            traj = rollout(model, cond, noise, sampler, g, micro_batch=cfg.rollout_micro_batch)
            images[name] = (model.decode(traj.latents[-1]).double(), before + after)
        ref = images.pop("reference (euler 4n)")[0]
        rms = {k: ((img - ref) ** 2).flatten(1).mean(1).sqrt() for k, (img, _) in images.items()}  # (P,)
        closer = float((rms["dpmpp-2m n/2"] < rms["euler n/2"]).double().mean())
        for name, (_, calls) in images.items():
            rows.append(
                {
                    "window": f"{start}-{end}",
                    "way": name,
                    "ode_steps": calls,
                    "rms_to_reference": float(rms[name].mean()),
                    "closer_than_euler_half": closer if name == "dpmpp-2m n/2" else None,
                }
            )
    print("| window | outside the window | ODE steps | RMS to the 4n-step Euler images (0-255) |")
    print("|---|---|---|---|")
    for r in rows:
        extra = ""
        if r["closer_than_euler_half"] is not None:
            extra = f" (closer than euler n/2 on {100 * r['closer_than_euler_half']:.0f} % of prompts)"
        print(f"| {r['window']} | {r['way']} | {r['ode_steps']} | {r['rms_to_reference']:.3f}{extra} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

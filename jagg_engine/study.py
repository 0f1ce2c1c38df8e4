"""`jagg study`: the fidelity study — gradient cosine by group, and reward parity of exact vs JAGG vs endpoint.

jagg study cosine --backbone tiny-shapes --window 4 --batches 5
    per group mean ± std over rollout batches of cosine(g_jagg, g_exact) (and endpoint-only), plus the
    whole-update cosine for each jagg_frac; the same probe routine as `jagg probe` and training.

jagg study bias --run N [--step S] [--rollouts K] [--json] [--out DIR]
    the bias of JAGG's EXPECTED gradient at a run's checkpoint: g_exact and g_jagg averaged over K independent
    rollouts of the run's own batch (:mod:`jagg_engine.bias`: cos_expected, rel_bias and its noise level, the
    noise floor of two halves, per inner step the credit error and the α that would minimise it).

jagg study parity CONFIG --strategies exact,jagg,endpoint --seeds 0,1,2 [key=value …]
    trains one run per (strategy, seed) through `jagg train` with identical config, prompts and seeds, then
    reports per strategy the training-reward gain (mean of the last 10 steps − mean of the first 10), the
    eval gain (last eval − step-0 eval) and the update-phase time, as mean ± std over seeds; writes
    report.md, results.json and a plotly figure (HTML; PNG when kaleido is installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from jagg_engine.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="study", required=True)
    c = sub.add_parser("cosine", help="gradient cosine per group over several rollout batches")
    c.add_argument("--backbone", default=None, help="default tiny-shapes (with --run: the run's)")
    c.add_argument("--window", type=int, default=None, help="W (default 4; with --run: the run's)")
    c.add_argument("--steps", type=int, default=None, help="sampling steps (default 12)")
    c.add_argument("--sde-window", default=None, help="START:END of the trained steps (default 0:12)")
    c.add_argument("--batches", type=int, default=5)
    c.add_argument("--batch", type=int, default=16, help="samples per rollout batch")
    c.add_argument(
        "--reward",
        default=None,
        help="score the rollout with this reward and use GRPO advantages (groups of --group-size, batch std);"
        " default: seeded N(0, 1) advantages (with --run: the run's rewards)",
    )
    c.add_argument(
        "--group-size", type=int, default=None, help="samples per prompt with --reward (default 8)"
    )
    c.add_argument(
        "--run",
        type=int,
        default=None,
        help="measure this run's model at --step, with its own sampler (SDE window, ODE steps), W, rewards"
        " and group size",
    )
    c.add_argument(
        "--step", type=int, default=None, help="with --run: checkpoint step (0: the base; default the last)"
    )
    c.add_argument("--runs-dir", default="runs", help="with --run: the runs folder")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default=None, help="folder for cosine.md and cosine.json")
    b = sub.add_parser(
        "bias", help="the bias of JAGG's expected gradient at a run's checkpoint, over K rollouts"
    )
    b.add_argument(
        "--run", type=int, required=True, help="the run whose model, sampler, batch and rewards are measured"
    )
    b.add_argument("--step", type=int, default=None, help="checkpoint step (0: the base; default the last)")
    b.add_argument(
        "--rollouts", type=int, default=16, help="K independent rollouts of the run's batch (>= 2)"
    )
    b.add_argument(
        "--replicas",
        action="store_true",
        help="also the far endpoint's credit at a replica of its state (fresh noise from each inner step on):"
        " splits JAGG's bias into the coupling to the step's own noise and the rest",
    )
    b.add_argument(
        "--cross",
        action="store_true",
        help="also the far credit cross-fitted: each inner credit at the far state of the next sample of its"
        " group (far_credit=cross), and that estimator's bias",
    )
    b.add_argument(
        "--eta", type=float, default=None, help="the SDE's noise level for the rollouts (default: the run's)"
    )
    b.add_argument("--runs-dir", default="runs", help="the runs folder")
    b.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    b.add_argument("--out", default=None, help="folder for bias-run<N>-step<S>.md and .json")
    q = sub.add_parser("parity", help="train exact / jagg / endpoint over seeds and compare rewards")
    q.add_argument("config", nargs="?", default="configs/tiny-shapes-cpu.yaml")
    q.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    q.add_argument("--strategies", default="exact,jagg,endpoint")
    q.add_argument("--seeds", default="0,1,2")
    q.add_argument("--jagg-frac", type=float, default=0.6)
    q.add_argument("--runs-dir", default="runs/study")
    q.add_argument("--out", default="reports/parity")
    q.add_argument("--report-only", action="store_true", help="rebuild the report from finished runs")


def _mean_std(xs: list[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.pstdev(xs)) if xs else (float("nan"), float("nan"))


# ------------------------------------------------------------------------------------------------ cosine


def _cosine_subject(args: argparse.Namespace) -> tuple[str, str, Any, Any, Any, dict[str, float] | None, int]:
    """What ``jagg study cosine`` measures: (its label, the backbone's name, the model, the sampler, the update,
    the rewards or None for N(0, 1) advantages, the group size). With ``--run``: the run's model at ``--step``
    on the sampler its training step ``--step`` used (the trainer's own builder) with its W, rewards and
    group size; the flags that would contradict them are refused."""
    from jagg_engine.backbones import BackboneConfigError, build_backbone
    from jagg_engine.jagg import UpdateConfig
    from jagg_engine.sde import SamplerConfig

    if args.run is None:
        if args.step is not None:
            raise UsageError("--step: only with --run")
        try:
            start, end = (int(x) for x in (args.sde_window or "0:12").split(":"))
            sampler = SamplerConfig(num_steps=args.steps or 12, sde_window=(start, end))
            update = UpdateConfig(window=args.window or 4)
            name = args.backbone or "tiny-shapes"
            backbone = build_backbone(name)
        except (ValueError, BackboneConfigError) as exc:
            raise UsageError(str(exc).splitlines()[0]) from None
        rewards = {args.reward: 1.0} if args.reward else None
        return name, name, backbone, sampler, update, rewards, args.group_size or 8
    from jagg_engine.export import asked_step, load_run_model, open_run
    from jagg_engine.train.trainer import pipeline_schedule, sampler_config

    given = {"--backbone": args.backbone, "--window": args.window, "--steps": args.steps}
    given |= {"--sde-window": args.sde_window, "--group-size": args.group_size}
    for flag, value in given.items():
        if value is not None:
            raise UsageError(f"{flag}: with --run the run's own is measured; leave it out")
    run = open_run(args.runs_dir, args.run)
    step = asked_step(run, args.step)
    backbone = load_run_model(run, step)
    rewards = {args.reward: 1.0} if args.reward else dict(run.cfg.rewards)
    update = UpdateConfig(window=run.cfg.window)
    sampler = sampler_config(run.cfg, pipeline_schedule(run.cfg, backbone), step or 1)
    label = f"run {run.id} step {step}"
    return label, run.cfg.backbone, backbone, sampler, update, rewards, run.cfg.group_size


def run_cosine(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from jagg_engine.backbones.base import default_prompts
    from jagg_engine.probe import probe_groups
    from jagg_engine.sde import rollout

    label, name, backbone, sampler, update, rewards, group_size = _cosine_subject(args)
    if args.batches < 1:
        raise UsageError(f"batches: must be a positive integer, got {args.batches}")
    reward = None
    if rewards:
        from jagg_engine.grpo import group_advantages
        from jagg_engine.rewards.registry import RewardConfigError, WeightedReward

        if group_size < 2 or args.batch % group_size:
            raise UsageError(f"group-size: must be >= 2 and divide --batch {args.batch}, got {group_size}")
        try:
            reward = WeightedReward(rewards)
        except RewardConfigError as exc:
            raise UsageError(str(exc)) from None
    params = backbone.trainable_parameters()
    per_group: dict[int, dict[str, list[float]]] = {}
    whole: dict[str, list[float]] = {}
    bounds: dict[int, tuple[float, float]] = {}
    for b in range(args.batches):
        seed = args.seed + b
        gen = torch.Generator().manual_seed(seed)
        if reward is None:
            prompts = default_prompts(backbone, args.batch, seed)
        else:  # whole prompt groups, as in training
            unique = default_prompts(backbone, args.batch // group_size, seed)
            prompts = [p for p in unique for _ in range(group_size)]
        cond = backbone.encode_prompts(prompts)
        noise = torch.randn(len(prompts), *backbone.latent_shape, generator=gen, dtype=params[0].dtype)
        traj = rollout(backbone, cond, noise, sampler, generator=gen)
        if reward is None:
            adv = torch.randn(len(prompts), generator=gen, dtype=torch.float64)
        else:
            scores, _ = reward(backbone.decode(traj.latents[-1]), prompts)
            groups = torch.arange(len(prompts)) // group_size
            adv = group_advantages(scores, groups, std="centered").double()
        rows, w = probe_groups(backbone, params, traj, adv, update, sampler, with_endpoint=True)
        for r in rows:
            g = per_group.setdefault(r.index, {"cosine": [], "endpoint_cosine": [], "rel_error": []})
            g["cosine"].append(r.cosine)
            g["endpoint_cosine"].append(r.endpoint_cosine)
            g["rel_error"].append(r.rel_error)
            bounds[r.index] = (r.t_start, r.t_end)
        for k, v in w.items():
            whole.setdefault(k, []).append(v)
        print(f"batch {b + 1}/{args.batches} done", file=sys.stderr)
    trained = sampler.sde_steps()
    result = {
        "subject": label,
        "backbone": name,
        "run": args.run,
        "window": update.window,
        "trained_steps": [trained[0], trained[-1] + 1],
        "batches": args.batches,
        "groups": [
            {
                "index": k,
                "t_start": bounds[k][0],
                "t_end": bounds[k][1],
                **{f"{m}_mean": _mean_std(v)[0] for m, v in g.items()},
                **{f"{m}_std": _mean_std(v)[1] for m, v in g.items()},
            }
            for k, g in sorted(per_group.items())
        ],
        "whole_update": {k: {"mean": _mean_std(v)[0], "std": _mean_std(v)[1]} for k, v in whole.items()},
    }
    lines = [
        f"Gradient cosine by group: {label}, W = {update.window}, trained steps {trained[0]}:{trained[-1] + 1} of "
        f"{sampler.num_steps}, {args.batches} rollout batches of {args.batch}, advantages "
        + (f"from {', '.join(rewards)} (groups of {group_size})" if rewards else "N(0, 1)")
        + " (mean ± std)",
        "",
        "| group | t | cosine(JAGG, exact) | cosine(endpoint, exact) | rel. error JAGG |",
        "|---|---|---|---|---|",
    ]
    for g in result["groups"]:
        lines.append(
            f"| {g['index']} | {g['t_start']:.2f} → {g['t_end']:.2f} | {g['cosine_mean']:.3f} ± {g['cosine_std']:.3f}"
            f" | {g['endpoint_cosine_mean']:.3f} ± {g['endpoint_cosine_std']:.3f}"
            f" | {g['rel_error_mean']:.3f} ± {g['rel_error_std']:.3f} |"
        )
    lines += [
        "",
        "Whole-update cosine: "
        + ", ".join(f"{k} {v['mean']:.4f} ± {v['std']:.4f}" for k, v in result["whole_update"].items()),
    ]
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = (
            "cosine-"
            + label.replace(" step ", "-step").replace(" ", "")
            + (f"-{args.reward}" if args.reward else "")
        )
        (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
        (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    return result


# ------------------------------------------------------------------------------------------------ bias


def run_bias(args: argparse.Namespace) -> dict[str, Any]:
    """``jagg study bias``: K rollouts of the run's own batch at checkpoint ``--step``, drawn from the run's
    streams of the training steps that would follow it (S + 1 … S + K: their prompts, initial and SDE noise),
    on the sampler of step S + 1 (the trainer's builder: pipeline σ, SDE window, ODE re-spacing), scored by the
    run's rewards into its GRPO advantages; the exact and JAGG gradients under the run's W and routing."""
    import torch
    from tqdm import tqdm

    from jagg_engine.bias import BiasAccumulator, rollout_gradients
    from jagg_engine.export import asked_step, load_run_model, open_run, trained_parameters
    from jagg_engine.grpo import group_advantages
    from jagg_engine.rewards.registry import RewardConfigError, WeightedReward
    from jagg_engine.train.trainer import (
        pipeline_schedule,
        prompt_source,
        rank_prompts,
        sample_rollout,
        sampler_config,
    )

    if isinstance(args.rollouts, bool) or args.rollouts < 2:
        raise UsageError(
            f"--rollouts: must be an integer >= 2 (two halves for the noise floor), got {args.rollouts}"
        )
    run = open_run(args.runs_dir, args.run)
    cfg = run.cfg
    if cfg.strategy == "endpoint" or cfg.window < 3:
        raise UsageError(
            f"--run: run {run.id} trains strategy {cfg.strategy} with W = {cfg.window}; the bias is JAGG's, over"
            " windows of 3 or more steps (a run of strategy jagg, or exact: JAGG's bias at the exact run's states)"
        )
    step = asked_step(run, args.step)
    model = load_run_model(run, step)
    try:
        reward = WeightedReward(cfg.rewards, cfg.reward_options)
    except RewardConfigError as exc:
        raise UsageError(str(exc)) from None
    params = trained_parameters(model, cfg)
    sampler = sampler_config(cfg, pipeline_schedule(cfg, model), step + 1)
    if args.eta is not None:
        if not (math.isfinite(args.eta) and 0 < args.eta <= 10):
            raise UsageError(f"--eta: must be in (0, 10], got {args.eta}")
        sampler = dataclasses.replace(sampler, eta=args.eta)
    update = cfg.update_config()
    if cfg.strategy == "exact":  # JAGG's bias at the states the exact backward trained to (the same window)
        update = dataclasses.replace(update, strategy="jagg", jagg_frac=1.0)
    ref = getattr(model, "reference_velocity", None) if cfg.beta > 0 else None
    prompts_all = prompt_source(cfg)
    device, dtype = params[0].device, params[0].dtype
    acc = BiasAccumulator()
    for k in tqdm(
        range(args.rollouts), desc=f"bias run {run.id} step {step}", unit="rollout", file=sys.stderr
    ):
        s = step + 1 + k
        prompts, groups = rank_prompts(cfg, prompts_all, s)
        traj = sample_rollout(cfg, model, sampler, update, s, 0, prompts, device, dtype)
        with torch.no_grad():
            total, _ = reward(model.decode(traj.latents[-1]), prompts)
        adv = group_advantages(total, groups, std=cfg.adv_std, clip=cfg.adv_clip)
        replicas = torch.Generator().manual_seed(cfg.seed * 1_000_003 + s) if args.replicas else None
        cross = cfg.group_size if args.cross else None
        acc.add(rollout_gradients(model, params, traj, adv.to(device), update, sampler, ref, replicas, cross))
    trained = sampler.sde_steps()
    result = {
        "subject": f"run {run.id} step {step}",
        "run": run.id,
        "step": step,
        "backbone": cfg.backbone,
        "window": cfg.window,
        "jagg_frac": cfg.jagg_frac,
        "trained_steps": [trained[0], trained[-1] + 1],
        "sampling_steps": cfg.sampling_steps,
        "batch": cfg.prompts_per_step * cfg.group_size,
        "streams": [step + 1, step + args.rollouts],
        "eta": sampler.eta,
        "replicas": bool(args.replicas),
        "cross": bool(args.cross),
        "group_noise": cfg.group_noise,
        **acc.summary(),
    }
    lines = _bias_lines(result)
    if args.json:
        print(json.dumps(finite(result)))
    else:
        print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"bias-run{run.id}-step{step}"
        (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
        (out / f"{stem}.json").write_text(json.dumps(finite(result), indent=1))
    return result


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (a figure the rollouts did not define) as None: strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _bias_lines(r: dict[str, Any]) -> list[str]:
    """The bias study as Markdown: the whole-update figures, then one row per inner step."""
    nf = r["noise_floor"]

    def pm(key: str, row: dict[str, Any] | None = None, fmt: str = ".4f") -> str:
        row = r if row is None else row
        se = row.get(f"{key}_se", math.nan)
        return f"{row[key]:{fmt}}" + ("" if math.isnan(se) else f" ± {se:{'.2e' if 'e' in fmt else '.4f'}}")

    lines = [
        f"JAGG's expected-gradient bias: {r['subject']} ({r['backbone']}), W = {r['window']}, trained steps "
        f"{r['trained_steps'][0]}:{r['trained_steps'][1]} of {r['sampling_steps']}, {r['rollouts']} rollouts of "
        f"{r['batch']} samples (the run's streams of steps {r['streams'][0]}–{r['streams'][1]})",
        "",
        "| figure | of the means | unbiased (± jackknife SE) | what it says |",
        "|---|---|---|---|",
        f"| cos_expected | {r['cos_expected']:.4f} | {pm('cos_expected_u')} | cos(E g_jagg, E g_exact) |",
        f"| rel_bias | {r['rel_bias']:.4f} | {pm('rel_bias_u')} | ‖E(g_jagg − g_exact)‖ / ‖E g_exact‖ |",
        f"| bias_along | {r['bias_along']:+.4f} | {pm('bias_along_u', fmt='+.4f')} | the bias along E g_exact, in"
        " its units (negative: shrinks it) |",
        f"| signal share | | {pm('signal_share_u')} | ‖E g_exact‖² / mean ‖g_exact‖²: resolving E g takes K ≫ 1 / it |",
        f"| noise_floor cos / rel | {nf['cos']:.4f} / {nf['rel']:.4f} | | the exact means of two halves |",
        f"| per-batch cos (mean, min) | {r['per_batch_cos_mean']:.4f}, {r['per_batch_cos_min']:.4f} | | what"
        " `jagg study cosine` sees |",
        "",
    ]
    if r["rollouts"] >= 16 and not math.isfinite(r["cos_expected_u_se"]):
        lines += [
            "No jackknife SE: leaving a group of rollouts out, an unbiased ‖E g‖² (exact or JAGG) was ≤ 0 in some "
            "replicate — these rollouts do not resolve the expected gradient (more rollouts, or a larger batch).",
            "",
        ]
    lines += [
        "| group | inner step | t | α | credit error (means) | unbiased | along (unbiased) | best α (unbiased) |"
        " credit error at best α |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in r["inner_steps"]:
        lines.append(
            f"| {s['group']} | {s['step']} | {s['t']:.3f} | {s['alpha']:.3f} | {s['credit_error']:.4f} |"
            f" {pm('credit_error_u', s)} | {pm('credit_along_u', s, '+.4f')} | {pm('alpha_best_u', s, '.3f')} |"
            f" {s['credit_error_best_u']:.4f} |"
        )
    if r.get("estimators"):
        replicas = "coupling_u" in r["estimators"][0]
        cross = "rel_bias_cross_u" in r["estimators"][0]
        lines += [
            "",
            "JAGG at each alpha_scale c (the inner steps' far weight c·α_j; the same cost), unbiased ± jackknife SE;"
            " noise = tr Cov(g) / ‖E g_exact‖²; bias share = ‖E(g_c − g_exact)‖² / mean ‖g_exact‖², in the units"
            " of the signal share above (no ‖E g‖² in it, so resolved where rel_bias is not: a bias share"
            " beside the signal share is a bias as large as the signal)"
            + (
                "; coupling = the part of the bias from pairing ε_j with a far state that holds it, replica = the"
                " bias left with the far credit at a replica of that state"
                if replicas
                else ""
            )
            + (
                "; cross = the estimator whose inner far credits go to the next sample of the group's far state"
                " (far_credit=cross)"
                if cross
                else ""
            ),
            "",
            "| c | rel_bias | bias_along | noise | bias share |"
            + (" coupling | coupling share | replica's rel_bias |" if replicas else "")
            + (" cross's rel_bias | cross's bias_along | cross's bias share |" if cross else ""),
            "|---|---|---|---|---|"
            + ("---|---|---|" if replicas else "")
            + ("---|---|---|" if cross else ""),
        ]
        for e in r["estimators"]:
            line = (
                f"| {e['alpha_scale']:g} | {pm('rel_bias_u', e)} | {pm('bias_along_u', e, '+.4f')} |"
                f" {e['noise_u']:.1f} | {pm('bias_share_u', e, '.2e')} |"
            )
            if replicas:
                line += f" {pm('coupling_u', e)} | {pm('coupling_share_u', e, '.2e')} | {pm('rel_bias_replica_u', e)} |"
            if cross:
                line += (
                    f" {pm('rel_bias_cross_u', e)} | {pm('bias_along_cross_u', e, '+.4f')} |"
                    f" {pm('bias_share_cross_u', e, '.2e')} |"
                )
            lines.append(line)
    return lines


# ------------------------------------------------------------------------------------------------ parity


def _train(config: str, overrides: list[str], runs_dir: str) -> int:
    cmd = [sys.executable, "-m", "jagg_engine.cli", "train", config, *overrides, "--runs-dir", runs_dir]
    print("$ " + " ".join(cmd[2:]), file=sys.stderr)
    return subprocess.run(cmd).returncode


def run_summary(frame, eval_key: str = "eval/reward/mean") -> dict[str, float]:
    """Gains of one run from its metrics frame: training reward last 10 − first 10 steps, eval last − first."""
    train = frame.loc[frame["step"] > 0, "reward/mean"].dropna().tolist()
    ev = frame[["step", eval_key]].dropna() if eval_key in frame else frame.iloc[0:0]
    n = min(10, len(train) // 2)
    upd = frame.loc[frame["step"] > 1, "time/update"].dropna().tolist()  # step 1 carries warm-up
    return {
        "steps": len(train),
        "train_first": statistics.fmean(train[:n]) if n else float("nan"),
        "train_last": statistics.fmean(train[-n:]) if n else float("nan"),
        "train_gain": statistics.fmean(train[-n:]) - statistics.fmean(train[:n]) if n else float("nan"),
        "eval_start": float(ev[eval_key].iloc[0]) if len(ev) else float("nan"),
        "eval_end": float(ev[eval_key].iloc[-1]) if len(ev) else float("nan"),
        "eval_gain": float(ev[eval_key].iloc[-1] - ev[eval_key].iloc[0]) if len(ev) > 1 else float("nan"),
        "update_s_median": statistics.median(upd) if upd else float("nan"),
        "step_s_median": statistics.median(
            frame.loc[frame["step"] > 1, "time/step"].dropna().tolist() or [0]
        ),
    }


def run_parity(args: argparse.Namespace) -> dict[str, Any]:
    from jagg_engine.store import open_store

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise UsageError(f"seeds: a comma-separated list of integers, got {args.seeds!r}") from None
    for s in strategies:
        if s not in ("exact", "jagg", "endpoint"):
            raise UsageError(f"strategies: each one of exact, jagg, endpoint, got {s!r}")
    names = {s: f"parity-{s}" for s in strategies}
    if not args.report_only:
        for seed in seeds:  # interleaved: a drift of the machine's speed hits every strategy alike
            for s in strategies:
                extra = [f"strategy={s}", f"seed={seed}", f"name={names[s]}-seed{seed}"]
                if s != "exact":
                    extra.append(f"jagg_frac={args.jagg_frac}")
                code = _train(args.config, [*args.overrides, *extra], args.runs_dir)
                if code != 0:
                    raise UsageError(f"training {s} seed {seed} failed with exit code {code}")
    store = open_store(args.runs_dir)
    runs = [r for r in store.list_runs() if r["status"] == "finished" and r["name"].startswith("parity-")]
    per: dict[str, list[dict[str, Any]]] = {s: [] for s in strategies}
    curves: dict[str, list[tuple[int, Any]]] = {s: [] for s in strategies}
    for r in sorted(runs, key=lambda r: r["id"]):
        s = r["config"]["strategy"]
        if s in per and r["config"]["seed"] in seeds:
            frame = store.metrics_frame(r["id"])
            per[s].append({"run_id": r["id"], "seed": r["config"]["seed"], **run_summary(frame)})
            curves[s].append((r["config"]["seed"], frame))
    summary = {}
    for s, rows in per.items():
        summary[s] = {
            k: _mean_std([row[k] for row in rows])
            for k in ("train_gain", "eval_gain", "eval_end", "update_s_median", "step_s_median")
        }
        summary[s]["n"] = len(rows)
    exact_update = summary.get("exact", {}).get("update_s_median", (float("nan"),))[0]
    lines = [
        f"Reward parity on {args.config} ({', '.join(args.overrides) or 'as shipped'}); jagg/endpoint at "
        f"jagg_frac = {args.jagg_frac}; seeds {args.seeds}; mean ± std over seeds.",
        "",
        "| strategy | runs | train gain (last 10 − first 10) | eval gain | final eval | update s/step | "
        "update speedup vs exact |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, m in summary.items():
        speed = exact_update / m["update_s_median"][0] if m["update_s_median"][0] else float("nan")
        lines.append(
            f"| {s} | {m['n']} | {m['train_gain'][0]:+.3f} ± {m['train_gain'][1]:.3f} | "
            f"{m['eval_gain'][0]:+.3f} ± {m['eval_gain'][1]:.3f} | {m['eval_end'][0]:.3f} ± {m['eval_end'][1]:.3f} | "
            f"{m['update_s_median'][0]:.2f} | {speed:.2f}× |"
        )
    lines += [
        "",
        "Per run:",
        "",
        "| strategy | seed | run | train first 10 | last 10 | gain | eval start → end |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, rows in per.items():
        for row in rows:
            lines.append(
                f"| {s} | {row['seed']} | {row['run_id']} | {row['train_first']:.3f} | {row['train_last']:.3f} | "
                f"{row['train_gain']:+.3f} | {row['eval_start']:.3f} → {row['eval_end']:.3f} |"
            )
    report = "\n".join(lines) + "\n"
    print(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report)
    (out / "results.json").write_text(json.dumps({"summary": summary, "runs": per}, indent=1, default=str))
    _parity_figure(curves, out)
    return {"summary": summary, "runs": per}


def _parity_figure(curves: dict[str, list[tuple[int, Any]]], out: Path) -> None:
    import plotly.graph_objects as go

    colours = {"exact": "#1f77b4", "jagg": "#d62728", "endpoint": "#7f7f7f"}
    fig = go.Figure()
    for s, runs in curves.items():
        for seed, frame in runs:
            f = frame[frame["step"] > 0]
            smooth = f["reward/mean"].rolling(5, min_periods=5).mean()  # from one whole epoch of prompts on
            fig.add_trace(
                go.Scatter(
                    x=f["step"],
                    y=smooth,
                    mode="lines",
                    name=f"{s} seed {seed}",
                    legendgroup=s,
                    line={"color": colours.get(s), "width": 1.5},
                    showlegend=True,
                )
            )
            if "eval/reward/mean" in frame:
                ev = frame[["step", "eval/reward/mean"]].dropna()
                fig.add_trace(
                    go.Scatter(
                        x=ev["step"], y=ev["eval/reward/mean"], mode="lines+markers",
                        name=f"{s} seed {seed} · eval", legendgroup=s,
                        line={"color": colours.get(s), "width": 2.5, "dash": "dash"},
                        marker={"symbol": "diamond", "size": 7},
                    )
                )  # fmt: skip
    fig.update_layout(
        title="Reward: training (5-step moving mean, thin) and eval (dashed): exact vs JAGG vs endpoint",
        xaxis_title="step",
        yaxis_title="reward",
        template="plotly_white",
    )
    fig.write_html(out / "parity.html", include_plotlyjs="cdn")
    try:
        fig.write_image(out / "parity.png", width=1000, height=560)
    except Exception as exc:  # kaleido is optional: fall back to a headless Chromium screenshot
        if not _browser_png(fig, out / "parity.png", 1000, 560):
            print(
                f"note: no PNG ({type(exc).__name__}, no Chromium); the HTML figure is written",
                file=sys.stderr,
            )


BROWSERS = ("chromium", "chromium-browser", "google-chrome")  # headless renderers of the parity PNG


def _browser_png(fig, png: Path, width: int, height: int) -> bool:
    """Render ``fig`` to ``png`` with a headless Chromium (offline: plotly.js inlined). Returns success."""
    import shutil
    import tempfile

    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "figure.html"
        fig.write_html(
            page, include_plotlyjs=True, full_html=True, default_width=width, default_height=height,
            config={"displayModeBar": False},
        )  # fmt: skip
        cmd = [
            browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--hide-scrollbars", f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
            "--virtual-time-budget=5000", page.as_uri(),
        ]  # fmt: skip
        try:
            subprocess.run(cmd, capture_output=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return png.is_file() and png.stat().st_size > 0


def run(args: argparse.Namespace) -> int:
    if args.study == "cosine":
        run_cosine(args)
    elif args.study == "bias":
        run_bias(args)
    else:
        run_parity(args)
    return 0

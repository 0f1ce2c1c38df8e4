"""The `jagg` command: probe | eval | bench | train | runs | export | export-model | sample | reindex | report | race.

Every user error (a bad flag value, an unknown backbone or strategy) ends with exit code 2 and ONE line
``jagg <command>: error: <field>: <what is allowed>`` — no traceback, nothing half-written. So does a corrupt
``jagg.db`` (the line names it and ``jagg reindex``). A reader that closes the pipe early (``jagg runs | head``)
ends the command quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from jagg_engine.errors import UsageError

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

__all__ = ["UsageError", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: must be a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name}: must be a positive integer, got {value}")
        return value

    return parse


# ----------------------------------------------------------------------------------------------------------
# probe


def _add_probe(p: argparse.ArgumentParser) -> None:
    from .backbones import BACKBONES
    from .sde import SDE_KINDS

    p.add_argument("--backbone", default="tiny-flux", help=f"one of {', '.join(BACKBONES)}")
    p.add_argument("--window", type=int, default=4, help="W, trained steps per JAGG group (>= 2)")
    p.add_argument("--steps", type=_positive_int("steps"), default=12, help="sampling steps T")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=_positive_int("batch"), default=4, help="rollout batch size")
    p.add_argument("--algorithm", default="flow-grpo", help=f"SDE: one of {', '.join(SDE_KINDS)}")
    p.add_argument("--eta", type=float, default=0.7, help="SDE noise level")
    p.add_argument("--shift", type=float, default=1.0, help="schedule time shift (1 = uniform)")
    p.add_argument("--endpoint", action="store_true", help="also report the endpoint-only ablation's cosine")
    p.add_argument("--model-path", default=None, help="local folder or hub id (flux, qwen-image, sd3)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _run_probe(args: argparse.Namespace) -> int:
    import torch

    from .backbones import BackboneConfigError, build_backbone
    from .backbones.base import default_prompts
    from .jagg import UpdateConfig
    from .probe import probe_groups
    from .sde import SamplerConfig, rollout

    try:
        update = UpdateConfig(strategy="jagg", window=args.window)
        sampler = SamplerConfig(kind=args.algorithm, num_steps=args.steps, eta=args.eta, shift=args.shift)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = {"model_path": args.model_path} if args.model_path else {}
    try:
        backbone = build_backbone(args.backbone, **options)
    except (BackboneConfigError, TypeError, ValueError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    params = backbone.trainable_parameters()
    if len(sampler.sde_steps()) < 2:
        raise UsageError(f"steps: need at least 2 trained steps for a group, got {args.steps}")

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    dtype = params[0].dtype
    cond = backbone.encode_prompts(default_prompts(backbone, args.batch, args.seed))
    noise = torch.randn(args.batch, *backbone.latent_shape, generator=gen, dtype=dtype)
    traj = rollout(backbone, cond, noise, sampler, generator=gen)
    # The probe needs a policy-gradient signal, not a good one: seeded N(0, 1) advantages.
    advantages = torch.randn(args.batch, generator=gen, dtype=torch.float64)
    rows, whole = probe_groups(
        backbone, params, traj, advantages, update, sampler, with_endpoint=args.endpoint
    )

    if args.json:
        print(
            json.dumps(
                {
                    "backbone": args.backbone,
                    "window": args.window,
                    "steps": args.steps,
                    "groups": [r.to_dict() for r in rows],
                    "whole_update_cosine": whole,
                }
            )
        )
        return 0
    header = f"{'group':>5} {'t_start':>8} {'t_end':>8} {'cosine':>10} {'rel_error':>10}"
    header += f" {'endpoint_cos':>12}" if args.endpoint else ""
    print(f"JAGG gradient fidelity: backbone={args.backbone} W={args.window} T={args.steps} seed={args.seed}")
    print(header)
    for r in rows:
        line = f"{r.index:>5} {r.t_start:>8.3f} {r.t_end:>8.3f} {r.cosine:>10.6f} {r.rel_error:>10.3e}"
        print(line + (f" {r.endpoint_cosine:>12.6f}" if args.endpoint else ""))
    print("whole-update cosine: " + ", ".join(f"{k} {v:.6f}" for k, v in whole.items()))
    return 0


# ----------------------------------------------------------------------------------------------------------


# name → (help, module, its add_arguments, its run): every module an engine module (tests/test_layers.py)
def _raised_at(exc: BaseException) -> str:
    """``; raised at FILE:LINE in FUNCTION``, the innermost frame of ``exc``'s traceback: where a write that
    names no file failed (an OSError from a write call carries no path)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f"; raised at {Path(last.filename).name}:{last.lineno} in {last.name}"


MODULE_COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "eval": (
        "mean ± std reward of a model on fixed prompts and seeds",
        "jagg_engine.evaluate",
        "add_arguments",
        "run",
    ),
    "bench": (
        "time the update phase of every strategy against the cost model",
        "jagg_engine.bench",
        "add_arguments",
        "run",
    ),
    "study": (
        "fidelity study: cosine by group, reward parity of exact vs jagg vs endpoint",
        "jagg_engine.study",
        "add_arguments",
        "run",
    ),
    "train": ("run GRPO training under accelerate", "jagg_engine.train.launch", "add_arguments", "run"),
    "runs": ("list the run history", "jagg_engine.runs_cli", "add_runs_arguments", "run_runs"),
    "export": (
        "write a run's metrics as CSV and JSON",
        "jagg_engine.runs_cli",
        "add_export_arguments",
        "run_export",
    ),
    "export-model": (
        "write a run's trained weights as a folder diffusers (or model_path=) loads, with a model card",
        "jagg_engine.export",
        "add_arguments",
        "run",
    ),
    "sample": (
        "images of typed prompts from a run, an export or the base model, each with its reward",
        "jagg_engine.sample",
        "add_arguments",
        "run",
    ),
    "reindex": (
        "rebuild the run index (jagg.db) from the run folders",
        "jagg_engine.runs_cli",
        "add_reindex_arguments",
        "run_reindex",
    ),
    "report": (
        "write runs as one self-contained HTML file (config, curves, speedup, images)",
        "jagg_engine.report.page",
        "add_arguments",
        "run",
    ),
    "race": (
        "time to quality: variants side by side, eval reward against training time, over seeds",
        "jagg_engine.race.command",
        "add_arguments",
        "run",
    ),
}


def _commands() -> dict[str, tuple[str, Callable, Callable]]:
    """name → (help, add_arguments, run). Imports of heavy modules happen inside ``run``."""
    cmds: dict[str, tuple[str, Callable, Callable]] = {
        "probe": ("gradient fidelity of JAGG vs exact, per group", _add_probe, _run_probe),
    }
    import importlib

    for name, (help_, module, add, run) in MODULE_COMMANDS.items():

        def lazy(attr: str, module: str = module) -> Callable:
            return lambda *a: getattr(importlib.import_module(module), attr)(*a)

        cmds[name] = (help_, lazy(add), lazy(run))
    return cmds


def build_parser(commands: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; ``commands`` names the subcommands whose arguments are added (None = all). Every
    subcommand is listed with its help either way, so ``jagg --help`` builds none and imports nothing heavy."""
    parser = _Parser(
        prog="jagg", description="JAGG Studio: GRPO for flow-matching transformers, made cheaper."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_, add, _run) in _commands().items():
        command = sub.add_parser(name, help=help_, description=help_)
        if commands is None or name in commands:
            add(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Only the named command's arguments are built: its module (and torch, where it needs it) is imported
    # for that command alone, so `jagg --help`, `jagg runs` and `jagg report` start without torch.
    parser = build_parser(argv[:1])
    args = parser.parse_args(argv)
    run = _commands()[args.command][2]
    try:
        code = int(run(args) or 0)
        sys.stdout.flush()  # a reader that left (`| head`) raises here, inside this try, not at exit
        return code
    except UsageError as exc:
        print(f"jagg {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`jagg runs | head`): no traceback, no flush error at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # a shell's code for SIGPIPE
    except Exception as exc:
        from jagg_engine.errors import disk_full_path, is_disk_full
        from jagg_engine.store import CorruptIndexError

        if is_disk_full(exc):  # a write that did not fit: one line naming it, as a failed run's error reads
            where = disk_full_path(exc, "") or " ".join(
                f"? ({type(exc).__name__}: {exc}{_raised_at(exc)})".split()
            )
            print(f"jagg {args.command}: error: disk full: {where}", file=sys.stderr)
            return 1
        if not isinstance(exc, CorruptIndexError):
            raise
        print(f"jagg {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jagg {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

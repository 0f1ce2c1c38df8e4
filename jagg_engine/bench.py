"""`jagg bench`: the cost model of the update phase and a timing harness that checks it.

Cost model: :mod:`jagg_engine.cost` (torch-free, shared with the app). One forward without grad costs 1 unit,
a forward with grad plus its backward r units; per group of n trained steps exact costs n·r, jagg and
jagg-sequential (n − 2) + 2r, endpoint and jagg+reuse 2r, paper-code n + 2r, routed as the engine routes;
jagg+reuse+cv (velocity reuse and the control variate at ``--cv-frac`` p, the shipped setting) 2r + p·(n − 2)·r;
pair (plain subsampling, pair_cv 0) 2r, pair+cv (pair_cv 1: every step's credit, the undrawn steps forwarded
without grad) (n − 2) + 2r, pair+reuse+cv (those credits from the rollout) 2r.

The joint JAGG backward (one batched 2B forward and one backward) and the sequential one (two B forwards and
two backwards) have the same unit cost; a batched call can only be cheaper per sample, never dearer.

Timing harness: one rollout batch, then the update phase of every strategy, repeated round-robin (one warm-up
round first) so that a drift in machine load hits every strategy alike; medians and min–max per strategy, and
per-round paired speedups. On a shared CPU, ``--threads 1 --clock cpu`` times with the process's CPU time,
which other jobs do not inflate. Every strategy is :func:`jagg_engine.jagg.policy_update`, the same code the
trainer calls (``paper-code`` with its own routine for the routed groups). ``r`` is measured on the same model
and batch: median(grad forward + backward) over median(no-grad forward), both interleaved with the updates.

Micro-batches (``--micro-batch m``): every strategy of the engine runs with ``UpdateConfig.micro_batch = m`` (the
update forwards and backwards m samples at a time and accumulates the gradient), and ``r`` is measured on a
micro-batch, the unit the update runs. ``paper-code`` is a schedule of this module, not of the engine, and is
left out then.

Peak memory, over one extra (untimed) update per strategy: the peak of live autograd-saved tensor bytes
(``saved_tensors_hooks``; storages counted once, model parameters and rollout tensors excluded) — the
activation memory the strategies differ in, the same figure on every device — and, on a GPU, also
``torch.cuda.max_memory_allocated`` (everything: weights, optimizer-free gradients, activations, workspace) and
its rise over the memory allocated before the update. Activations saved inside gradient-checkpointed blocks
are recomputed, not saved, so the saved-activation figure leaves them out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .backbones import BACKBONES
from .backbones.base import VelocityFn, default_prompts
from .cost import BENCH_STRATEGIES, cost_model_speedup
from .credit import aggregate_upstream, interpolation_weights
from .devices import default_dtype, resolve_device
from .jagg import UpdateConfig, UpdateResult, UpdateState, policy_update
from .sde import SamplerConfig, Trajectory, rollout
from .streams import torch_stream

CLOCKS = ("wall", "cpu")
CV_FRAC = 0.25  # jagg+reuse+cv's default control-variate fraction: the shipped config's cv_frac


def bench_backbones() -> tuple[str, ...]:
    """The backbones `jagg bench` offers: the registry's entries flagged ``bench``."""
    return tuple(name for name, spec in BACKBONES.items() if spec.bench)


# ----------------------------------------------------------------------------------------------------------
# The paper authors' schedule, as a baseline

UpdateFn = Callable[[VelocityFn, Trajectory, torch.Tensor, SamplerConfig], UpdateResult]


def _paper_code_group(state: UpdateState, steps: list[int]) -> None:
    """All n steps forwarded without grad → s_j; then endpoint 0 forward+backward with s_base, endpoint
    n−1 forward+backward with s_corr (two backward calls). Same s_base/s_corr as JAGG (phases 2–3)."""
    alpha = interpolation_weights(state.traj.sigmas[steps])  # (n,)
    s_all = torch.stack([state.upstream(state.forward([j], grad=False), j) for j in steps])  # (n, B, *S)
    s_base, s_corr = aggregate_upstream(s_all, alpha)
    for j, s in ((steps[0], s_base), (steps[-1], s_corr)):
        v = state.forward([j], grad=True)  # (B, *S)
        state.backward([v], [s])


def paper_code_update(update: UpdateConfig) -> UpdateFn:
    """The `paper-code` strategy: JAGG's gradient computed the way the paper authors' public code schedules it.

    :func:`~jagg_engine.jagg.policy_update` of ``update`` (strategy jagg, its routing) with
    :func:`_paper_code_group` for the routed groups (n + 2r units each); the rest run the engine's exact
    routine. A baseline for `jagg bench`, not a training path.
    """
    if update.strategy != "jagg":
        raise ValueError(f"strategy: paper-code computes the jagg gradient, got {update.strategy!r}")
    routines = {"jagg": _paper_code_group}
    return lambda model, traj, adv, sampler: policy_update(
        model, traj, adv, update, sampler, routines=routines
    )


def strategy_update(
    name: str, window: int, jagg_frac: float, micro_batch: int | None = None, cv_frac: float = CV_FRAC
) -> UpdateFn:
    """The update routine of bench strategy ``name``: policy_update with its UpdateConfig, or paper-code.

    ``micro_batch``: the engine's ``UpdateConfig.micro_batch`` (None = the whole batch at once); paper-code has none.
    ``cv_frac``: the control variate of ``jagg+reuse+cv``, drawn from the same seeded stream on every call (each
    timed round does the same work).
    """
    extra: dict[str, Any] = {} if micro_batch is None else {"micro_batch": micro_batch}
    options = {
        "exact": dict(strategy="exact"),
        "jagg": dict(strategy="jagg", endpoint_backward="joint"),
        "jagg-sequential": dict(strategy="jagg", endpoint_backward="sequential"),
        "endpoint": dict(strategy="endpoint"),
        "paper-code": dict(strategy="jagg"),
        "jagg+reuse": dict(strategy="jagg", reuse_rollout_velocity="auto"),
        "jagg+reuse+cv": dict(strategy="jagg", reuse_rollout_velocity="auto", cv_frac=cv_frac),
        "pair": dict(strategy="pair", pair_cv=0.0),
        "pair+cv": dict(strategy="pair", pair_cv=1.0),
        "pair+reuse+cv": dict(strategy="pair", pair_cv=1.0, reuse_rollout_velocity="auto"),
    }
    if name not in options:
        raise ValueError(f"strategy: must be one of {', '.join(BENCH_STRATEGIES)}, got {name!r}")
    if name == "paper-code" and micro_batch is not None:
        raise ValueError("strategy: paper-code has no micro-batches; leave it out with --micro-batch")
    update = UpdateConfig(window=window, jagg_frac=jagg_frac, **options[name], **extra)
    if name == "paper-code":
        return paper_code_update(update)
    if update.cv_frac > 0 or update.strategy == "pair":
        stream = "pair" if update.strategy == "pair" else "control_variate"
        return lambda model, traj, adv, sampler: policy_update(
            model, traj, adv, update, sampler, generator=torch_stream(0, 0, 0, stream)
        )
    return lambda model, traj, adv, sampler: policy_update(model, traj, adv, update, sampler)


# ----------------------------------------------------------------------------------------------------------
# Measurement


class SavedActivationMeter:
    """Peak bytes of live autograd-saved tensors inside the ``with`` block (CPU peak-memory measure).

    Each saved tensor is wrapped at pack time; its storage is counted once however many saved tensors view
    it, and uncounted when the last wrapper is released (the graph freed by its backward). Storages of
    ``exclude`` (parameters, rollout tensors) are not counted.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._live: dict[int, list[int]] = {}  # storage pointer → [references, bytes]
        self.current = 0
        self.peak = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> SavedActivationMeter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, t: torch.Tensor) -> object:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._exclude or storage.nbytes() == 0:
            return t
        return _Saved(self, t, ptr, storage.nbytes())

    @staticmethod
    def _unpack(x: object) -> torch.Tensor:
        return x.tensor if isinstance(x, _Saved) else x

    def _add(self, ptr: int, nbytes: int) -> None:
        entry = self._live.setdefault(ptr, [0, nbytes])
        if entry[0] == 0:
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        entry[0] += 1

    def _remove(self, ptr: int) -> None:
        entry = self._live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self._live[ptr]


class _Saved:
    __slots__ = ("meter", "tensor", "ptr")

    def __init__(self, meter: SavedActivationMeter, tensor: torch.Tensor, ptr: int, nbytes: int):
        self.meter, self.tensor, self.ptr = meter, tensor, ptr
        meter._add(ptr, nbytes)

    def __del__(self) -> None:
        self.meter._remove(self.ptr)


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, Trajectory):
        parts = (tree.latents, tree.log_probs, tree.sigmas, tree.velocities, tree.cond)
        return [t for v in parts for t in _tensors(v)]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _zero(params: list[torch.nn.Parameter]) -> None:
    for p in params:
        p.grad = None


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def bench_update(
    model: VelocityFn,
    params: list[torch.nn.Parameter],
    traj: Trajectory,
    advantages: torch.Tensor,
    sampler: SamplerConfig,
    window: int,
    jagg_frac: float,
    repeats: int = 7,
    strategies: Sequence[str] = BENCH_STRATEGIES,
    r_samples: int = 2,
    clock: str = "wall",
    micro_batch: int | None = None,
    cv_frac: float = CV_FRAC,
) -> dict[str, Any]:
    """Time the update phase of each strategy on one rollout batch; see the module docstring.

    Round-robin: one warm-up round, then ``repeats`` rounds; each round runs every strategy once (gradients
    zeroed before each) and ``r_samples`` no-grad forwards and grad forward+backward passes of step 0 on the
    first ``micro_batch`` samples (all of them when None), the unit of work the update runs.
    ``clock``: "wall" (``time.perf_counter``, CUDA-synchronised) or "cpu" (``time.process_time``: the CPU time
    of this process, which other processes on a shared CPU do not inflate; meant for one intra-op thread).
    Returns the ``jagg bench --json`` object minus the run description.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock: must be one of {', '.join(CLOCKS)}, got {clock!r}")
    now = time.perf_counter if clock == "wall" else time.process_time
    device = traj.latents.device
    updates = {name: strategy_update(name, window, jagg_frac, micro_batch, cv_frac) for name in strategies}
    unit = traj.select(slice(0, micro_batch or traj.batch_size))  # the samples one model call sees
    B = unit.batch_size
    z0, t0_ = unit.latents[0], unit.sigmas[0].expand(B)
    upstream = torch.randn(z0.shape, generator=torch.Generator().manual_seed(0)).to(device)

    def forward_only() -> None:
        with torch.no_grad():
            model(z0, t0_, unit.cond)

    def forward_backward() -> None:
        v = model(z0, t0_, unit.cond)
        torch.autograd.backward([v], [upstream.to(v.dtype)])

    def timed(fn: Callable[[], object]) -> tuple[float, object]:
        _zero(params)
        _sync(device)
        start = now()
        out = fn()
        _sync(device)
        return now() - start, out

    times: dict[str, list[float]] = {name: [] for name in strategies}
    fwd_times: dict[str, list[float]] = {name: [] for name in strategies}
    bwd_times: dict[str, list[float]] = {name: [] for name in strategies}
    counts: dict[str, dict[str, int]] = {}
    r_fwd: list[float] = []
    r_fb: list[float] = []
    for round_ in range(repeats + 1):  # round 0 is the warm-up
        for name in strategies:
            dt, res = timed(lambda name=name: updates[name](model, traj, advantages, sampler))
            if round_ > 0:
                times[name].append(dt)
                fwd_times[name].append(res.time_forward)
                bwd_times[name].append(res.time_backward)
                counts[name] = vars(res.counts).copy()
        for _ in range(r_samples):
            dt_f, _ = timed(forward_only)
            dt_fb, _ = timed(forward_backward)
            if round_ > 0:
                r_fwd.append(dt_f)
                r_fb.append(dt_fb)
    _zero(params)

    r = statistics.median(r_fb) / statistics.median(r_fwd)
    K = len(traj.sde_steps)
    exact = times.get("exact")
    out: dict[str, Any] = {
        "r": r,
        "micro_batch": micro_batch,
        "clock": clock,
        "forward_s": _spread(r_fwd),
        "forward_backward_s": _spread(r_fb),
        "trained_steps": K,
        "strategies": {},
    }
    mems = peak_memory(model, params, traj, advantages, sampler, updates)
    out["peak_mem_measure"] = "cuda_max_memory_allocated" if "cuda" in mems else "peak_saved_activation_bytes"
    for name in strategies:
        med = statistics.median(times[name])
        row: dict[str, Any] = {
            "median_s": med,
            "min_s": min(times[name]),
            "max_s": max(times[name]),
            "median_forward_s": statistics.median(fwd_times[name]),
            "median_backward_s": statistics.median(bwd_times[name]),
            "predicted_speedup": cost_model_speedup(
                window, r, jagg_frac, name, K, cv_frac=cv_frac if name == "jagg+reuse+cv" else 0.0
            ),
            "peak_saved_activation_bytes": mems["saved"][name],
            "peak_mem_bytes": mems["cuda" if "cuda" in mems else "saved"][name],
            "counts": counts[name],
        }
        if "cuda" in mems:
            row["peak_cuda_bytes"] = mems["cuda"][name]
            row["peak_cuda_over_baseline_bytes"] = mems["cuda_rise"][name]
        if exact is not None:
            paired = [e / s for e, s in zip(exact, times[name])]
            row["speedup_vs_exact"] = statistics.median(exact) / med
            row["paired_speedup"] = _spread(paired)
            row["measured_over_predicted"] = row["speedup_vs_exact"] / row["predicted_speedup"]
        out["strategies"][name] = row
    return out


def peak_memory(
    model: VelocityFn,
    params: list[torch.nn.Parameter],
    traj: Trajectory,
    advantages: torch.Tensor,
    sampler: SamplerConfig,
    updates: dict[str, UpdateFn],
) -> dict[str, dict[str, int]]:
    """One untimed update per strategy under :class:`SavedActivationMeter`; on a GPU the same update also gives
    ``torch.cuda.max_memory_allocated`` and its rise over the memory allocated before it.

    Returns {"saved": {strategy: bytes}} plus, on a GPU, "cuda" and "cuda_rise" of the same shape.
    """
    device = traj.latents.device
    cuda = device.type == "cuda"
    buffers = list(model.buffers()) if isinstance(model, torch.nn.Module) else []
    exclude = [*params, *buffers, *_tensors(traj), advantages]
    peaks: dict[str, dict[str, int]] = {"saved": {}, **({"cuda": {}, "cuda_rise": {}} if cuda else {})}
    for name, fn in updates.items():
        _zero(params)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        with SavedActivationMeter(exclude) as meter:
            fn(model, traj, advantages, sampler)
        peaks["saved"][name] = meter.peak
        if cuda:
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
            peaks["cuda"][name], peaks["cuda_rise"][name] = int(peak), int(peak - before)
    _zero(params)
    return peaks


# ----------------------------------------------------------------------------------------------------------
# CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `jagg bench`."""
    p.add_argument("--backbone", default="bench-flux", help=f"one of {', '.join(bench_backbones())}")
    p.add_argument("--window", type=int, default=4, help="W, trained steps per group (>= 2)")
    p.add_argument("--jagg-frac", type=float, default=1.0, help="fraction of groups routed, in [0, 1]")
    p.add_argument("--batch", type=int, default=4, help="rollout batch size B")
    p.add_argument("--steps", type=int, default=16, help="sampling steps T (all trained)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds after one warm-up round (>= 1)")
    p.add_argument("--model-path", default=None, help="flux: pipeline folder; tiny-shapes: weights folder")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: bf16 on cuda, fp32 on cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    p.add_argument(
        "--clock",
        default="wall",
        help="wall | cpu: CPU time of this process (with --threads 1, robust to other jobs on a shared CPU)",
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="micro-batch of the update (train_micro_batch): samples per model call (default: the whole batch)",
    )
    p.add_argument(
        "--memory-only",
        action="store_true",
        help="only the peak-memory pass (one update per strategy), no timing rounds",
    )
    p.add_argument(
        "--cv-frac",
        type=float,
        default=CV_FRAC,
        help=f"control-variate fraction of jagg+reuse+cv, in (0, 1] (default {CV_FRAC}, the shipped cv_frac)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def build_bench_backbone(
    name: str, device: torch.device, dtype: torch.dtype, seed: int, model_path: str | None
) -> Any:
    """The backbone ``name`` for benchmarking, from its registry entry: ``seed``, ``dtype`` and ``device`` where
    its factory takes them; ``model_path`` through the option the entry reads from the model_path field, else
    random weights where the factory offers them (a backbone that loads weights and has no random ones needs
    --model-path). Raises ValueError with a one-line message on bad input."""
    import inspect

    from .backbones import BackboneConfigError, get_backbone

    if name not in bench_backbones():
        raise ValueError(f"backbone: must be one of {', '.join(bench_backbones())}, got {name!r}")
    spec = get_backbone(name)
    factory = spec.factory_fn()
    params = inspect.signature(factory).parameters
    options: dict[str, Any] = {
        k: v for k, v in (("seed", seed), ("dtype", dtype), ("device", device)) if k in params
    }
    path_option = next((option for option, field in spec.options.items() if field == "model_path"), None)
    if model_path and path_option:
        options[path_option] = model_path
    elif "random_weights" in params:
        options["random_weights"] = True
    elif spec.model_folder is not None:
        raise ValueError(f"model-path: required for --backbone {name} (a local folder of its weights)")
    try:
        model = factory(**options)
    except (BackboneConfigError, TypeError, OSError) as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    if "device" not in params and isinstance(model, torch.nn.Module):
        model = model.to(device)
    return model


def _check_args(args: argparse.Namespace) -> None:
    from .errors import UsageError

    if args.backbone not in bench_backbones():
        raise UsageError(f"backbone: must be one of {', '.join(bench_backbones())}, got {args.backbone!r}")
    if args.window < 2:
        raise UsageError(f"window: must be an integer >= 2, got {args.window}")
    if not (math.isfinite(args.jagg_frac) and 0.0 <= args.jagg_frac <= 1.0):
        raise UsageError(f"jagg_frac: must be in [0, 1], got {args.jagg_frac}")
    for field in ("repeats", "batch", "steps"):
        if getattr(args, field) < 1:
            raise UsageError(f"{field}: must be an integer >= 1, got {getattr(args, field)}")
    if args.micro_batch is not None and not 1 <= args.micro_batch <= args.batch:
        raise UsageError(
            f"micro_batch: must be an integer in 1..{args.batch} (the batch), got {args.micro_batch}"
        )
    if not (math.isfinite(args.cv_frac) and 0.0 < args.cv_frac <= 1.0):
        raise UsageError(f"cv_frac: must be in (0, 1], got {args.cv_frac}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"threads: must be an integer >= 1, got {args.threads}")
    if args.dtype not in (None, "float32", "fp32", "bfloat16", "bf16"):
        raise UsageError(f"dtype: must be one of float32, bfloat16, got {args.dtype!r}")
    if args.device not in (None, "cpu") and not str(args.device).startswith("cuda"):
        raise UsageError(f"device: must be cpu or cuda[:N], got {args.device!r}")
    if args.clock not in CLOCKS:
        raise UsageError(f"clock: must be one of {', '.join(CLOCKS)}, got {args.clock!r}")
    on_cuda = str(args.device).startswith("cuda") or (args.device is None and torch.cuda.is_available())
    if args.clock == "cpu" and on_cuda:
        raise UsageError("clock: cpu time does not measure GPU work; use --clock wall with --device cuda")
    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("device: cuda requested but no CUDA device is available")


def run(args: argparse.Namespace) -> int:
    """`jagg bench`: rollout, interleaved timing of every strategy, table or one JSON object."""
    from .errors import UsageError

    _check_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.dtype is None:
        dtype = default_dtype(device)
    else:
        dtype = torch.bfloat16 if args.dtype in ("bf16", "bfloat16") else torch.float32
    try:
        backbone = build_bench_backbone(args.backbone, device, dtype, args.seed, args.model_path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    report = bench_backbone(
        args.backbone,
        backbone,
        window=args.window,
        jagg_frac=args.jagg_frac,
        batch=args.batch,
        steps=args.steps,
        repeats=args.repeats,
        seed=args.seed,
        clock=args.clock,
        micro_batch=args.micro_batch,
        memory_only=args.memory_only,
        cv_frac=args.cv_frac,
    )
    if args.json:
        print(json.dumps(report))
    else:
        print(format_table(report))
    return 0


def bench_backbone(
    name: str,
    backbone: Any,
    window: int,
    jagg_frac: float,
    batch: int = 4,
    steps: int = 16,
    repeats: int = 7,
    seed: int = 0,
    clock: str = "wall",
    micro_batch: int | None = None,
    memory_only: bool = False,
    cv_frac: float = CV_FRAC,
    strategies: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One seeded rollout batch of ``backbone``, then :func:`bench_update` (or, with ``memory_only``, only
    :func:`peak_memory`); the full `jagg bench` report. ``strategies`` default: all of
    :data:`BENCH_STRATEGIES`, less paper-code with a ``micro_batch``."""
    sampler = SamplerConfig(num_steps=steps)
    params = backbone.trainable_parameters()
    gen = torch_stream(seed, 0, 0, "init_noise")  # the trainer's independent streams (jagg_engine.streams)
    device = params[0].device
    cond = backbone.encode_prompts(default_prompts(backbone, batch, seed))
    noise = torch.randn(batch, *backbone.latent_shape, generator=gen).to(device, params[0].dtype)
    sde_gen = torch_stream(seed, 0, 0, "sde_noise", device)  # drawn on the model's device
    traj = rollout(backbone, cond, noise, sampler, generator=sde_gen, store_velocities=True)  # for jagg+reuse
    # Timing needs a policy-gradient signal, not a good one: seeded N(0, 1) advantages.
    advantages = torch.randn(traj.batch_size, generator=gen, dtype=torch.float64).to(device)
    if strategies is None:
        strategies = [n for n in BENCH_STRATEGIES if micro_batch is None or n != "paper-code"]
    if memory_only:
        updates = {n: strategy_update(n, window, jagg_frac, micro_batch, cv_frac) for n in strategies}
        result = memory_report(peak_memory(backbone, params, traj, advantages, sampler, updates), micro_batch)
    else:
        result = bench_update(
            backbone,
            params,
            traj,
            advantages,
            sampler,
            window,
            jagg_frac,
            repeats=repeats,
            strategies=strategies,
            clock=clock,
            micro_batch=micro_batch,
            cv_frac=cv_frac,
        )
    return {
        "backbone": name,
        "window": window,
        "jagg_frac": jagg_frac,
        "cv_frac": cv_frac,
        "batch": traj.batch_size,
        "steps": steps,
        "repeats": repeats,
        "device": str(device),
        "dtype": str(params[0].dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in params),
        **result,
    }


def memory_report(mems: dict[str, dict[str, int]], micro_batch: int | None) -> dict[str, Any]:
    """The `--memory-only` report body: per strategy, the peaks of :func:`peak_memory`."""
    rows: dict[str, dict[str, int]] = {}
    for name, saved in mems["saved"].items():
        rows[name] = {"peak_saved_activation_bytes": saved}
        if "cuda" in mems:
            rows[name]["peak_cuda_bytes"] = mems["cuda"][name]
            rows[name]["peak_cuda_over_baseline_bytes"] = mems["cuda_rise"][name]
    return {"micro_batch": micro_batch, "memory_only": True, "strategies": rows}


def format_table(report: dict[str, Any]) -> str:
    """The human-readable form of a bench report."""
    head = (
        f"jagg bench: backbone={report['backbone']} W={report['window']} jagg_frac={report['jagg_frac']:g} "
        f"cv_frac={report.get('cv_frac', CV_FRAC):g} "
        f"T={report['steps']} B={report['batch']} micro_batch={report.get('micro_batch') or report['batch']} "
        f"device={report['device']} dtype={report['dtype']} threads={report['threads']} "
        f"params={report['params']:,}"
    )
    if report.get("memory_only"):
        lines = [head, f"{'strategy':<16} {'saved_act_MiB':>13} {'cuda_peak_MiB':>13} {'cuda_rise_MiB':>13}"]
        for name, row in report["strategies"].items():
            cuda = [
                row.get(k, math.nan) / 2**20 for k in ("peak_cuda_bytes", "peak_cuda_over_baseline_bytes")
            ]
            lines.append(
                f"{name:<16} {row['peak_saved_activation_bytes'] / 2**20:>13.2f} {cuda[0]:>13.2f} {cuda[1]:>13.2f}"
            )
        return "\n".join(lines)
    f, fb = report["forward_s"], report["forward_backward_s"]
    lines = [
        f"{head} repeats={report['repeats']} clock={report['clock']}",
        f"r = {report['r']:.3f}  (forward {1e3 * f['median']:.1f} ms [{1e3 * f['min']:.1f}–{1e3 * f['max']:.1f}], "
        f"forward+backward {1e3 * fb['median']:.1f} ms [{1e3 * fb['min']:.1f}–{1e3 * fb['max']:.1f}])",
        f"{'strategy':<16} {'median_s':>9} {'min–max_s':>15} {'speedup':>8} {'paired min–max':>15} "
        f"{'predicted':>9} {'meas/pred':>9} {'peak_mem_MiB':>12} {'saved_act_MiB':>13}",
    ]
    for name, row in report["strategies"].items():
        paired = row.get("paired_speedup", {"min": math.nan, "max": math.nan})
        lines.append(
            f"{name:<16} {row['median_s']:>9.3f} {row['min_s']:>7.3f}–{row['max_s']:<7.3f} "
            f"{row.get('speedup_vs_exact', math.nan):>8.3f} {paired['min']:>7.3f}–{paired['max']:<7.3f} "
            f"{row['predicted_speedup']:>9.3f} {row.get('measured_over_predicted', math.nan):>9.3f} "
            f"{row['peak_mem_bytes'] / 2**20:>12.2f} {row['peak_saved_activation_bytes'] / 2**20:>13.2f}"
        )
    lines.append(f"peak memory: {report['peak_mem_measure']}")
    return "\n".join(lines)

"""The policy a rollout sampled with, and the guard of velocity reuse: whether the model that is about to be
differentiated is bit for bit the one that sampled (the same tensors at the same versions and values, the
same plain settings, no random numbers drawn by a forward). :func:`same_policy` is the second check of reuse
(:func:`jagg_engine.jagg.policy_update`), after the trainer's own control flow."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .backbones.base import Cond, VelocityFn, index_cond


def _draws_random(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether an aten op consumes random numbers: seeded ops (bernoulli, rand, native_dropout, …), except a
    dropout with p = 0 or train = False (attention kernels are tagged seeded whatever their ``dropout_p``)."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    schema = func._schema.arguments
    named = {a.name: args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(schema)}
    if "dropout_p" in named:
        return bool(named["dropout_p"])
    if func.overloadpacket is torch.ops.aten.native_dropout:
        return bool(named["train"]) and bool(named["p"])
    return True


class _RandomOpWatch(TorchDispatchMode):
    """Records whether any op dispatched under it draws random numbers (module or functional dropout, …)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.seen = self.seen or _draws_random(func, args, kwargs)
        return func(*args, **kwargs)


@torch.no_grad()
def forward_draws_random(model: VelocityFn, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> bool:
    """Whether one forward of ``model`` on the first sample of (z, t, cond) draws random numbers — an active
    dropout, as a module or a functional call, in train mode. The RNG state is restored afterwards, so the
    check changes no later draw."""
    devices = [z.device] if z.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), _RandomOpWatch() as watch:
        model(z[:1], t[:1], index_cond(cond, slice(0, 1)))
    return watch.seen


@dataclass(frozen=True)
class PolicyState:
    """The policy as a rollout sampled it, read from the model itself (nothing to bump by hand):

    model:       a weak reference to the model object
    tensors:     its parameters and buffers (trainable and frozen), and ``versions``, their in-place version
                 counters (an optimizer step, ``load_state_dict``, ``copy_`` increment them)
    fingerprint: a hash of the values of those tensors, bit for bit (:func:`tensor_fingerprints`): it sees the
                 writes the version counters miss — ``p.data`` writes, ``vector_to_parameters``, fused and
                 foreach optimizers, DTensor shards
    settings:    every module's plain Python state (:func:`scalar_settings`): train/eval modes, peft adapters
                 enabled or disabled and their scales, a backbone's guidance scale
    random:      whether a forward drew random numbers (an active dropout)

    This is the second check of velocity reuse; the first is the caller's control flow (``policy_update``'s
    ``rollout_policy``: the trainer allows reuse only before any optimizer step or weight load).
    """

    model: weakref.ref
    tensors: tuple[torch.Tensor, ...]
    versions: tuple[int, ...]
    fingerprint: torch.Tensor
    settings: tuple
    random: bool


def _policy_tensors(model: VelocityFn) -> tuple[torch.Tensor, ...] | None:
    if isinstance(model, torch.nn.Module):
        return (*model.parameters(), *model.buffers())
    params = getattr(model, "trainable_parameters", None)
    return tuple(params()) if callable(params) else None


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


_CHUNK = 1 << 22  # elements hashed at a time: bounds the temporary int64 tensors (~100 MB)


_MULTIPLIERS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _multipliers(start: int, n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """m_i = 2·((i·2654435761) mod 2³⁰) + 1 for i in [start, start + n): odd, position-dependent (Knuth's
    multiplicative hash), in ``dtype``. The first chunk's are cached per device and dtype. Shape (n,)."""
    key = (device, dtype)
    if start == 0 and n <= _MULTIPLIERS.get(key, torch.empty(0)).numel():
        return _MULTIPLIERS[key][:n]
    size = n if start else min(max(n, 1 << (n - 1).bit_length()), _CHUNK)  # grow by powers of two
    pos = torch.arange(start, start + size, device=device, dtype=torch.int64)
    m = (pos * 2654435761 % (1 << 30) * 2 + 1).to(dtype)
    if start == 0:
        _MULTIPLIERS[key] = m
    return m[:n]


def tensor_fingerprints(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """One int64 hash per tensor of its values bit for bit: Σ_i (bits_i·m_i mod 2^k) with the raw bits of
    element i, an odd multiplier m_i that depends on the position i (:func:`_multipliers`) and k = 32 (64 for
    8-byte elements), the sum in int64. A change of one element's bits by d ≠ 0 (|d| < 2^k) changes its term,
    since d·m_i ≢ 0 mod 2^k for odd m_i; changes of several elements would have to cancel exactly in that
    weighted sum to go unseen. A DTensor is hashed by its local shard. Two passes over the values.
    Shape (n,), on the CPU."""
    out = []
    for x in tensors:
        local = x.to_local() if hasattr(x, "to_local") else x
        flat = local.detach().reshape(-1)
        if flat.dtype.is_complex:
            flat = torch.view_as_real(flat).reshape(-1)
        if flat.dtype == torch.bool:
            flat = flat.to(torch.uint8)
        bits = flat.view(_BITS[flat.element_size()])
        work = torch.int64 if bits.dtype == torch.int64 else torch.int32
        h = torch.zeros((), dtype=torch.int64, device=flat.device)
        for start in range(0, bits.numel(), _CHUNK):
            part = bits[start : start + _CHUNK].to(work)  # a no-op for 4- and 8-byte elements
            h = h + (part * _multipliers(start, part.numel(), flat.device, work)).sum(dtype=torch.int64)
        out.append(h)
    if not out:
        return torch.zeros(0, dtype=torch.int64)
    # A model may hold tensors on several devices (FLUX keeps its RoPE tables on the CPU): one device to stack.
    return torch.stack([h.to(out[0].device) for h in out]).cpu()


_SCALARS = (bool, int, float, str, type(None))


def _plain(value: object, depth: int = 0) -> object:
    """``value`` as a hashable plain value when it is a scalar or a small container of scalars, else ...."""
    if isinstance(value, _SCALARS):
        return value
    if depth < 2 and isinstance(value, (tuple, list, set, frozenset)) and len(value) <= 64:
        items = [_plain(v, depth + 1) for v in value]
        if all(i is not ... for i in items):
            return (
                type(value).__name__,
                tuple(sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items),
            )
    if depth < 2 and isinstance(value, dict) and len(value) <= 64:
        items = [(str(k), _plain(v, depth + 1)) for k, v in value.items()]
        if all(v is not ... for _, v in items):
            return ("dict", tuple(sorted(items)))
    return ...


# nn.Module's own book-keeping (hook registries, _parameters, …): not settings of the function it computes
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) - {"training"}


def scalar_settings(model: object) -> tuple:
    """The plain Python state of ``model`` and of each of its submodules: every attribute whose value is a
    bool, number, string or None, or a small tuple/list/dict of them. That holds a module's ``training`` flag,
    peft's ``_disable_adapters``, active adapter names and ``scaling`` dict, and a backbone's scalar settings
    (``cfg_scale``, a guidance value). Tensors and other objects are left out (the tensors are hashed), and so
    are nn.Module's own registries: a hook added after the rollout is not seen."""
    objects = list(model.modules()) if isinstance(model, torch.nn.Module) else [model]
    if not isinstance(model, torch.nn.Module):
        objects += [m for v in vars(model).values() if isinstance(v, torch.nn.Module) for m in v.modules()]
    out = []
    for obj in objects:
        state = getattr(obj, "__dict__", {})
        items = sorted((k, v) for k, v in state.items() if k not in _MODULE_INTERNALS)
        out.append(tuple((k, p) for k, v in items if (p := _plain(v)) is not ...))
    return tuple(out)


def _agree(changed: bool, tensors: tuple[torch.Tensor, ...]) -> bool:
    """Under FSDP (DTensor parameters) each rank hashes its own shards: the ranks agree that the policy changed
    when it did on any of them, so that every rank takes the same branch (a forward is a collective there)."""
    mesh = next((x.device_mesh for x in tensors if hasattr(x, "device_mesh")), None)
    if mesh is None:
        return changed
    import torch.distributed as dist

    device = next(x.to_local().device for x in tensors if hasattr(x, "device_mesh"))
    flag = torch.tensor([float(changed)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def policy_state(model: VelocityFn, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> PolicyState | None:
    """The state of ``model`` now (see :class:`PolicyState`); None when it cannot be read (a model that is
    not weak-referenceable or exposes no parameters), which disables reuse. Runs one one-sample forward."""
    tensors = _policy_tensors(model)
    try:
        ref = weakref.ref(model)
    except TypeError:
        return None
    if tensors is None:
        return None
    versions = tuple(x._version for x in tensors)
    return PolicyState(
        ref,
        tensors,
        versions,
        tensor_fingerprints(tensors),
        scalar_settings(model),
        forward_draws_random(model, z, t, cond),
    )


def same_policy(
    state: PolicyState | None, model: VelocityFn, z: torch.Tensor, t: torch.Tensor, cond: Cond
) -> bool:
    """Whether ``model`` is still the policy recorded in ``state``: the same object, the same parameter and
    buffer objects at the same versions holding the same bits, the same plain settings (modes, adapters,
    scales), and neither then nor now a forward that draws random numbers."""
    if state is None or state.random or state.model() is not model:
        return False
    tensors = _policy_tensors(model)
    if tensors is None or len(tensors) != len(state.tensors):
        return False
    changed = any(a is not b or a._version != v for a, b, v in zip(tensors, state.tensors, state.versions))
    changed = changed or not torch.equal(tensor_fingerprints(tensors), state.fingerprint)
    changed = changed or scalar_settings(model) != state.settings
    if _agree(changed, tensors):
        return False
    return not forward_draws_random(model, z, t, cond)

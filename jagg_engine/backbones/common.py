"""What the three diffusers adapters (flux, qwen-image, sd3) share: loading, freezing, LoRA, dtype, reference.

An adapter is a :class:`DiffusersBackbone` subclass plus ``build = diffusers_factory(Subclass, "SomePipeline",
DEFAULT_MODEL)``, its factory (registered in :mod:`jagg_engine.backbones.registry` with
``DIFFUSERS_OPTIONS``, the config fields every diffusers adapter reads).

A :class:`DiffusersBackbone` owns one diffusers pipeline. Its transformer is the trained module (registered as
a submodule, so ``.parameters()`` and ``.to()`` see it); text encoders and the VAE stay on the pipeline
object, frozen, in eval mode and outside the module tree. Subclasses implement ``velocity`` (the raw model
call), ``encode_prompts`` and ``_decode_latents``.

Precision (mixed precision with float32 master weights, as Flow-GRPO and DanceGRPO train): with a bf16
``dtype`` (the default on a GPU, ``precision: bf16``) the frozen weights load in bfloat16, every trained weight
is kept in float32 — the LoRA weights, or with full fine-tuning the whole transformer — and every forward runs
under bf16 autocast (CPU or GPU), so matmuls compute in bf16 while the optimizer steps float32 masters and an
update far below bf16's resolution (2⁻⁸ relative) still accumulates. With ``dtype`` float32 nothing is cast.

Reference policy (for the KL term): with LoRA it is the same transformer with the adapter disabled (peft's
adapter layers switched off); with full fine-tuning (``lora_rank=0``) a frozen copy of the initial weights.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import json
import typing
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..devices import default_dtype, resolve_device
from . import BackboneConfigError
from .base import Cond

# Attention projections of the joint (text + image) transformer blocks; the module names are the same in
# diffusers' Flux, SD3 and Qwen-Image transformers. The same set Flow-GRPO (Liu et al. 2025) trains.
ATTENTION_PROJECTIONS: tuple[str, ...] = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
)

_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
_DTYPES.update({"fp32": torch.float32, "float32": torch.float32})


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``None`` → bfloat16 on a GPU, float32 on the CPU; strings as 'bf16', 'fp16', 'fp32'."""
    if dtype is None:
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise BackboneConfigError(f"dtype: unknown dtype {dtype!r}; allowed: {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def _is_local(model_path: str) -> bool:
    return Path(model_path).expanduser().exists() or model_path.startswith(("/", ".", "~"))


def missing_pipeline_files(folder: Path) -> list[str]:
    """Files a diffusers pipeline folder lacks: ``model_index.json`` and each component's subfolder.

    An export of ``jagg export-model`` with a whole transformer (kinds merged, full) stands for a pipeline: its
    ``transformer/`` over the base pipeline it names (:func:`load_pipeline`); a LoRA export does not (it is a
    ``lora_path``)."""
    from ..export_format import INFO, export_kind

    if not folder.is_dir():
        return [f"the folder {folder}"]
    if (folder / INFO).is_file():
        kind = export_kind(folder)
        if kind == "lora":
            return [
                f"model_index.json (a LoRA export: pass the base model as model_path and {folder} as lora_path)"
            ]
        if kind not in ("merged", "full"):
            return [
                f"model_index.json (an export of kind {kind or 'unreadable'}, not a diffusers transformer)"
            ]
        return [] if (folder / "transformer" / "config.json").is_file() else ["transformer/config.json"]
    index = folder / "model_index.json"
    if not index.is_file():
        return ["model_index.json"]
    missing = []
    try:
        specs = json.loads(index.read_text(encoding="utf-8"))
        if not isinstance(specs, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError, RecursionError):
        return ["a readable model_index.json"]
    for name, spec in specs.items():
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue
        sub = folder / name
        if not sub.is_dir() or not any(sub.iterdir()):
            missing.append(f"{name}/")
    return missing


def _one_line(exc: BaseException, limit: int = 240) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def load_pipeline(
    pipeline_cls: type, model_path: str, model_name: str, torch_dtype: torch.dtype, **kwargs: Any
) -> Any:
    """``pipeline_cls.from_pretrained(model_path, torch_dtype=...)``, every failure turned into one line.

    A local folder is checked for missing files before loading; a hub id that cannot be fetched (offline,
    gated, misspelt) reports the loader's reason. Either way the message says how to pass a local folder.
    """
    hint = f"download it and pass model_path=/path/to/folder (a diffusers {pipeline_cls.__name__} folder)"
    if _is_local(model_path):
        folder = Path(model_path).expanduser()
        if not folder.is_dir():
            raise BackboneConfigError(f"{model_name}: folder {model_path!r} does not exist; {hint}")
        missing = missing_pipeline_files(folder)
        if missing:
            raise BackboneConfigError(f"{model_name}: missing {', '.join(missing)} in {model_path!r}; {hint}")
        from ..export_format import INFO, read_export

        if (folder / INFO).is_file():  # an export's transformer/ over the base pipeline it was trained from
            info = read_export(folder)
            if "transformer" in kwargs:
                raise BackboneConfigError(
                    f"{model_name}: {model_path!r} is an export; it brings its transformer"
                )
            kwargs["transformer"] = _load_transformer(folder / "transformer", torch_dtype, model_name)
            return load_pipeline(pipeline_cls, info["base_model"], model_name, torch_dtype, **kwargs)
    try:
        with warnings.catch_warnings():  # newer diffusers renamed torch_dtype to dtype; older ones lack dtype
            warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
            return pipeline_cls.from_pretrained(model_path, torch_dtype=torch_dtype, **kwargs)
    except (OSError, ValueError, ImportError, KeyError, RuntimeError) as exc:
        raise BackboneConfigError(
            f"{model_name}: cannot load {model_path!r} (model_index.json and component weights): "
            f"{_one_line(exc)}; {hint}"
        ) from exc


def _load_transformer(folder: Path, torch_dtype: torch.dtype, model_name: str) -> Any:
    """The diffusers model saved in ``folder`` (``save_pretrained``), of the class its config names."""
    try:
        name = json.loads((folder / "config.json").read_text())["_class_name"]
        cls = getattr(importlib.import_module("diffusers"), name)
        return cls.from_pretrained(folder, torch_dtype=torch_dtype)
    except (OSError, ValueError, KeyError, AttributeError, RuntimeError, TypeError) as exc:
        why = "config.json nested too deeply" if isinstance(exc, RecursionError) else _one_line(exc)
        raise BackboneConfigError(f"{model_name}: cannot load the transformer in {folder}: {why}") from exc


def freeze(*modules: torch.nn.Module | None) -> None:
    """Eval mode and no gradients for the modules that are not trained (text encoders, VAE)."""
    for m in modules:
        if m is not None:
            m.requires_grad_(False).eval()


def add_lora(
    transformer: torch.nn.Module,
    rank: int,
    alpha: float | None,
    target_modules: Sequence[str],
    dropout: float = 0.0,
) -> list[torch.nn.Parameter]:
    """Freeze ``transformer`` and add a peft LoRA adapter (B = 0 at init, so the policy starts at the base).

    Returns the LoRA parameters, cast to float32. ``alpha`` defaults to ``rank`` (scale α/r = 1).
    """
    from peft import LoraConfig

    transformer.requires_grad_(False)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else rank,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        init_lora_weights=True,
    )
    try:
        transformer.add_adapter(config)
    except ValueError as exc:  # peft: no module matched target_modules
        raise BackboneConfigError(f"lora_target_modules: {_one_line(exc)}") from exc
    params = [p for n, p in transformer.named_parameters() if "lora_" in n]
    for p in params:
        p.data = p.data.float()
        p.requires_grad_(True)
    return params


def load_lora(
    pipe: Any, lora_path: str, rank: int, alpha: float | None, model_name: str
) -> list[torch.nn.Parameter]:
    """Freeze the pipeline's transformer and load the LoRA export ``lora_path`` into it as the trained adapter
    ("default") with diffusers' own ``load_lora_weights``; its rank (and α, when ``alpha`` is set) must be the
    config's. Returns the LoRA parameters, cast to float32 and trainable (training goes on from them)."""
    transformer = pipe.transformer
    transformer.requires_grad_(False)
    try:
        pipe.load_lora_weights(str(Path(lora_path).expanduser()), adapter_name="default")
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise BackboneConfigError(f"lora_path: cannot load {lora_path!r}: {_one_line(exc)}") from exc
    config = transformer.peft_config["default"]
    if config.r != rank:
        raise BackboneConfigError(
            f"lora_rank: the LoRA in {lora_path} has rank {config.r}; set lora_rank={config.r}"
        )
    if alpha is not None and float(config.lora_alpha) != float(alpha):
        raise BackboneConfigError(
            f"lora_alpha: the LoRA in {lora_path} has alpha {config.lora_alpha:g}; set lora_alpha={config.lora_alpha:g}"
            " or leave it null"
        )
    params = [p for n, p in transformer.named_parameters() if "lora_" in n]
    for p in params:
        p.data = p.data.float()
        p.requires_grad_(True)
    return params


class DiffusersBackbone(torch.nn.Module):
    """Shared machinery of the diffusers adapters; see the module docstring.

    Args:
        pipe: the loaded diffusers pipeline (its ``transformer`` is trained).
        device, dtype: where and in which dtype the weights live.
        lora_rank: 0 = full fine-tuning, else the LoRA rank.
        lora_alpha: LoRA α (default = rank).
        lora_target_modules: module-name suffixes that get LoRA (default: attention projections).
        gradient_checkpointing: recompute transformer blocks in the backward pass.
        reference_copy: with ``lora_rank=0``, keep a frozen copy of the initial transformer for
            :meth:`reference` (doubles the transformer's memory); without it :meth:`reference` raises.
        lora_path: a LoRA export (``jagg export-model``) the adapter starts from (:func:`load_lora`) instead
            of a fresh one; the reference policy stays the base model (the adapter disabled).
    """

    name = "diffusers"

    def __init__(
        self,
        pipe: Any,
        device: torch.device,
        dtype: torch.dtype,
        lora_rank: int = 32,
        lora_alpha: float | None = None,
        lora_target_modules: Sequence[str] = ATTENTION_PROJECTIONS,
        gradient_checkpointing: bool = False,
        reference_copy: bool = True,
        lora_path: str | None = None,
    ):
        super().__init__()
        if lora_rank < 0:
            raise BackboneConfigError(f"lora_rank: must be >= 0 (0 = full fine-tuning), got {lora_rank}")
        self.pipe = pipe
        self.device_ = device
        self.dtype = dtype
        freeze(*(getattr(pipe, n, None) for n in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")))
        for n in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
            if getattr(pipe, n, None) is not None:
                getattr(pipe, n).to(device)
        self.transformer = pipe.transformer.to(device)
        self.transformer.eval()  # no dropout: rollout and update must see the same function
        self.lora_rank = lora_rank
        self._reference_transformer: list[torch.nn.Module] = []  # a list keeps it out of the module tree
        if lora_rank > 0 and lora_path is not None:
            self._trainable = load_lora(pipe, lora_path, lora_rank, lora_alpha, self.name)
        elif lora_rank > 0:
            self._trainable = add_lora(self.transformer, lora_rank, lora_alpha, lora_target_modules)
        elif lora_path is not None:
            raise BackboneConfigError("lora_path: a LoRA to start from needs LoRA; set lora_rank to its rank")
        else:
            self.transformer.requires_grad_(True)
            if reference_copy:  # frozen, so in the compute dtype
                ref = copy.deepcopy(self.transformer).requires_grad_(False).eval()
                self._reference_transformer.append(ref)
            self.transformer.float()  # float32 masters; the forward computes in ``dtype`` under autocast
            self._trainable = list(self.transformer.parameters())
        self._use_reference = False
        if gradient_checkpointing:
            self.enable_gradient_checkpointing()

    # ---- the Backbone protocol -------------------------------------------------------------------------
    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> torch.Tensor:
        """v̂(z, t, cond) of the policy (or of the reference inside :meth:`reference`); dtype of ``z``."""
        with self.autocast():
            v = self.velocity(self.active_transformer, z, t, cond)
        return v.to(z.dtype)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents (B, *latent_shape) → uint8 images (B, H, W, 3) on the CPU."""
        with torch.no_grad(), self.autocast():
            image = self._decode_latents(latents.to(self.device_))  # (B, 3, H, W) in [-1, 1]
        image = ((image.float() / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
        return image.permute(0, 2, 3, 1).cpu()  # (B, H, W, 3)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The LoRA weights (or all transformer weights when ``lora_rank=0``)."""
        return list(self._trainable)

    # ---- training helpers -------------------------------------------------------------------------------
    @property
    def active_transformer(self) -> torch.nn.Module:
        if self._use_reference and self._reference_transformer:
            return self._reference_transformer[0]
        return self.transformer

    @contextlib.contextmanager
    def reference(self) -> Iterator[DiffusersBackbone]:
        """Within the block, calling the backbone gives the reference policy's velocity.

        LoRA: the adapter is disabled (peft ``disable_adapters``) and re-enabled on exit. Full fine-tuning:
        the frozen copy of the initial weights is used.
        """
        if self.lora_rank > 0:
            self.transformer.disable_adapters()
            try:
                yield self
            finally:
                self.transformer.enable_adapters()
            return
        if not self._reference_transformer:
            raise BackboneConfigError(
                "reference: full fine-tuning without reference_copy has no reference policy"
            )
        self._use_reference = True
        try:
            yield self
        finally:
            self._use_reference = False

    @torch.no_grad()
    def reference_velocity(self, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> torch.Tensor:
        """v̂_ref(z, t, cond) without gradients: the ``ref_model`` callable for ``jagg.policy_update``."""
        with self.reference():
            return self(z, t, cond)

    def enable_gradient_checkpointing(self) -> None:
        """Recompute the transformer's blocks in the backward pass (memory for compute)."""
        self.transformer.enable_gradient_checkpointing()

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to ``dtype`` (bf16 compute over float32 masters) when it is not float32, on the CPU or GPU."""
        if self.dtype != torch.float32:
            return torch.autocast(self.device_.type, dtype=self.dtype)
        return contextlib.nullcontext()

    # ---- per model ---------------------------------------------------------------------------------------
    def pipeline_sigmas(self, num_steps: int) -> torch.Tensor:
        """σ_0 … σ_T of ``num_steps`` sampling steps as this backbone's diffusers pipeline sets its scheduler
        for the image size it trains at (:func:`scheduler_sigmas`). Shape (T + 1,), float64, σ_T the
        scheduler's terminal σ (0)."""
        raise NotImplementedError

    def velocity(
        self, transformer: torch.nn.Module, z: torch.Tensor, t: torch.Tensor, cond: Cond
    ) -> torch.Tensor:
        raise NotImplementedError

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        raise NotImplementedError

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def scheduler_sigmas(
    scheduler: Any,
    num_steps: int,
    *,
    sigmas: Sequence[float] | None = None,
    image_seq_len: int | None = None,
    max_shift: float = 1.15,
) -> torch.Tensor:
    """The σ grid a diffusers pipeline samples with: a copy of its ``scheduler`` set up by diffusers' own
    ``retrieve_timesteps`` with the pipeline's ``sigmas`` and, when ``image_seq_len`` is given, the dynamic shift
    μ = ``calculate_shift(image_seq_len, …)`` read from the scheduler's config (FLUX.1, Qwen-Image; SD3 only
    when its scheduler uses dynamic shifting; ``max_shift`` is the pipeline's default when the config has
    none). The scheduler's own shift (SD3's static 3.0), terminal σ and options apply as in the pipeline.
    Returns its ``sigmas``: (T + 1,) float64."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

    scheduler = copy.deepcopy(scheduler)  # the pipeline's own scheduler keeps its state
    extra: dict[str, Any] = {}
    if image_seq_len is not None:
        config = scheduler.config
        extra["mu"] = calculate_shift(
            image_seq_len,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", max_shift),
        )
    retrieve_timesteps(scheduler, num_steps, "cpu", sigmas=None if sigmas is None else list(sigmas), **extra)
    return torch.as_tensor(scheduler.sigmas, dtype=torch.float64).cpu()


def flux_like_sigmas(
    scheduler: Any, num_steps: int, image_seq_len: int, honour_flow_sigmas: bool = True
) -> torch.Tensor:
    """FluxPipeline and QwenImagePipeline: σ = linspace(1, 1/T, T) and the dynamic shift of the packed image's
    sequence length; FluxPipeline (``honour_flow_sigmas``) lets a scheduler with ``use_flow_sigmas`` make its
    own grid instead."""
    import numpy as np

    own = honour_flow_sigmas and scheduler.config.get("use_flow_sigmas", False)
    sigmas = None if own else np.linspace(1.0, 1 / num_steps, num_steps)
    return scheduler_sigmas(scheduler, num_steps, sigmas=sigmas, image_seq_len=image_seq_len)


def vae_decode(vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """``vae.decode`` → (B, 3, H, W) in [-1, 1], in the VAE's dtype."""
    return vae.decode(latents.to(vae.dtype), return_dict=False)[0]


def diffusers_factory(
    backbone_cls: type[DiffusersBackbone], pipeline: str, default_model: str
) -> Callable[..., DiffusersBackbone]:
    """The factory ``build(model_path=None, *, device=None, dtype=None, **options)`` of a diffusers adapter.

    It loads ``diffusers.<pipeline>`` from ``model_path`` (a local folder or hub id; None = ``default_model``)
    on ``device`` (None: CUDA when present) in ``dtype`` (None: bf16 on a GPU, fp32 on the CPU) and wraps it in
    ``backbone_cls``. Its signature lists the keyword options of ``backbone_cls`` and of
    :class:`DiffusersBackbone` with their defaults and types, so that an unknown or mistyped option (the
    config's ``backbone_options``) is refused before anything loads.
    """

    def build(
        model_path: str | None = None, *, device: str | None = None, dtype: str | None = None, **options: Any
    ) -> DiffusersBackbone:
        try:
            build.__signature__.bind(model_path, device=device, dtype=dtype, **options)
        except TypeError as exc:
            raise BackboneConfigError(f"{backbone_cls.name}: {exc}") from None
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        pipeline_cls = getattr(importlib.import_module("diffusers"), pipeline)
        pipe = load_pipeline(pipeline_cls, model_path or default_model, backbone_cls.name, dt)
        return backbone_cls(pipe, device=dev, dtype=dt, **options)

    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("model_path", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("device", keyword, default=None),
        inspect.Parameter("dtype", keyword, default=None),
    ]
    hints: dict[str, Any] = {"model_path": str | None, "device": str | None, "dtype": str | None}
    for cls in (backbone_cls, DiffusersBackbone):  # the adapter's own options first, then the shared ones
        cls_hints = typing.get_type_hints(cls.__init__)
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
            if p.kind is p.VAR_KEYWORD or p.name in ("pipe", "device", "dtype") or p.name in hints:
                continue
            hints[p.name] = cls_hints.get(p.name, Any)
            params.append(p.replace(kind=keyword, annotation=hints[p.name]))
    params[:3] = [p.replace(annotation=hints[p.name]) for p in params[:3]]
    build.__signature__ = inspect.Signature(params, return_annotation=backbone_cls)
    build.__annotations__ = {**hints, "return": backbone_cls}
    build.__module__ = backbone_cls.__module__
    build.__doc__ = (
        f"Load a diffusers {pipeline} from ``model_path`` (None = {default_model!r}) and wrap it in "
        f"{backbone_cls.__name__}; see :func:`jagg_engine.backbones.common.diffusers_factory`."
    )
    return build

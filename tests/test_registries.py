"""One registry per extension point: an SDE kind, a reward and a backbone registered from this file alone are
used end to end in a one-step training run (in-process, and through `jagg train` with the ``plugins`` field);
unknown names are one-line errors naming the field and the allowed values; listing the names imports no torch.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from docs_pages import section as docs_section
from toy import TOY

from jagg_engine.backbones import BACKBONES, BackboneConfigError, register_backbone
from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.rewards import registry as rewards
from jagg_engine.sde import SDE_KINDS, SamplerConfig, StepOutput, gaussian_log_prob, register_sde, rollout
from jagg_engine.store import open_store
from jagg_engine.train.config import ALGORITHMS, ConfigError, TrainConfig, load_config

REPO = Path(__file__).resolve().parents[1]
SDE, REWARD, BACKBONE = "test-euler-maruyama", "test-mean-grey", "test-toy"
# One GRPO step on a 16-dim toy: 2 prompts × 2 samples, 4 sampling steps (all trained), windows of 2, the
# toy run of the fault tests without its backbone and reward.
ONE_STEP = ["steps=1", *(o for o in TOY if not o.startswith(("backbone=", "rewards=")))]  # tests/toy.py
calls = {"step": 0, "reward": 0, "factory": []}


def euler_maruyama_step(sampler, v, z, j, sigmas, prev_sample=None, noise=None, generator=None) -> StepOutput:
    """Euler–Maruyama with constant diffusion η: μ = z − (σ_j − σ_{j+1})·v̂, std = η·sqrt(σ_j − σ_{j+1})."""
    calls["step"] += 1
    dtype = torch.promote_types(v.dtype, torch.float32)
    v, z = v.to(dtype), z.to(dtype)
    ds = (sigmas[j] - sigmas[j + 1]).to(dtype)
    mean = z - ds * v
    std = sampler.eta * torch.sqrt(ds)
    if prev_sample is None:
        prev_sample = mean + std * noise.to(dtype)
    prev_sample = prev_sample.to(dtype)
    return StepOutput(prev_sample, gaussian_log_prob(prev_sample, mean, std), mean, std)


def mean_grey() -> object:
    def score(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        calls["reward"] += 1
        return images.float().mean(dim=(1, 2, 3)) / 255.0

    return score


def toy_factory(seed: int = 0, dim: int = 16) -> LinearToy:
    calls["factory"].append(seed)
    return LinearToy(dim=dim, seed=seed)


@pytest.fixture
def registries() -> Iterator[None]:
    """Whatever a test registers is gone afterwards: the three registries are restored to their contents."""
    rewards.available_rewards()  # the built-in rewards first (found lazily), so that the restore keeps them
    saved = [(registry, dict(registry)) for registry in (SDE_KINDS, BACKBONES, rewards._REGISTRY)]
    yield
    for registry, contents in saved:
        registry.clear()
        registry.update(contents)


@pytest.fixture
def registered(registries) -> None:
    """The three test entries, registered from this file alone."""
    register_sde(SDE, euler_maruyama_step, help="test: Euler–Maruyama with constant diffusion")
    rewards.register_reward(REWARD, help="test: mean grey level")(mean_grey)
    # The backbone reads the config's seed (how a backbone says which config fields it takes).
    register_backbone(BACKBONE, toy_factory, options={"seed": "seed"}, procedural_prompts=True)
    calls.update(step=0, reward=0, factory=[])


def test_registered_sde_reward_and_backbone_train_one_step_in_process(registered, tmp_path: Path) -> None:
    from jagg_engine.backbones import build_backbone
    from jagg_engine.train.process import train

    overrides = [
        f"backbone={BACKBONE}",
        f"algorithm={SDE}",
        f"rewards={{{REWARD}: 1.0}}",
        "seed=7",
        *ONE_STEP,
    ]
    cfg = load_config(None, overrides)
    assert SDE in ALGORITHMS  # the config's list is the registry's
    assert cfg.backbone_kwargs() == {"seed": 7}
    store = open_store(tmp_path)
    run_id = store.create_run("registered", cfg.to_dict(), tmp_path / "run")
    assert train(run_id, str(tmp_path)) == 0
    run = store.get_run(run_id)
    assert run["status"] == "finished", run["error"]
    frame = store.metrics_frame(run_id)
    assert frame.loc[frame["step"] == 1, f"reward/{REWARD}/mean"].notna().all()
    # Each test entry did the work: 4 SDE steps per rollout, the reward once per step, the factory with seed 7.
    assert calls["step"] >= 4 and calls["reward"] >= 1 and calls["factory"][0] == 7
    from jagg_engine.train import checkpoint

    initial = build_backbone(BACKBONE, seed=7).trainable_parameters()
    final = checkpoint.read(tmp_path / "run" / "checkpoints" / "step_00001").params
    assert len(initial) == len(final)
    assert any(not torch.equal(a.detach(), b) for a, b in zip(initial, final)), "no parameter changed"


def test_registered_sde_drives_the_sampler(registered) -> None:
    """The step comes from the entry (no branch to forget): a rollout of the test kind calls it T times, its
    stored log-prob is the step's own on the stored next sample, and h_j is the Euler–Maruyama default."""
    model = LinearToy(dim=8)
    sampler = SamplerConfig(kind=SDE, num_steps=3, eta=0.5)
    gen = torch.Generator().manual_seed(0)
    traj = rollout(model, None, torch.randn(2, 8, dtype=torch.float64), sampler, generator=gen)
    assert calls["step"] == 3 and sampler.sde_steps() == [0, 1, 2]
    j, z = 1, traj.latents[1]
    again = euler_maruyama_step(
        sampler, model(z, traj.sigmas[j].expand(2)), z, j, traj.sigmas, traj.latents[2]
    )
    torch.testing.assert_close(again.log_prob, traj.log_probs[1])
    torch.testing.assert_close(sampler.kl_step_size(j, traj.sigmas), traj.sigmas[1] - traj.sigmas[2])


def test_a_kind_whose_last_step_is_not_stochastic_keeps_it_an_ode_step(registries) -> None:
    register_sde("test-no-last", euler_maruyama_step, last_step_stochastic=False, max_eta=0.5)
    assert SamplerConfig(kind="test-no-last", num_steps=4).sde_steps() == [0, 1, 2]
    cfg = TrainConfig(algorithm="test-no-last", eta=0.5, sampling_steps=6, sde_window_end=None)
    assert cfg.sde_window() == (0, 5)
    with pytest.raises(ConfigError, match=r"^eta: test-no-last needs 0 < eta <= 0.5, got 0.7$"):
        TrainConfig(algorithm="test-no-last", eta=0.7, sde_window_end=None).validate(check_environment=False)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm=ddim", "algorithm: must be one of flow-grpo, dance, cps, got 'ddim'"),
        (
            "backbone=sdxl",
            "backbone: must be one of tiny-shapes, flux, qwen-image, sd3, tiny-flux, bench-flux, ",
        ),
        (
            "rewards={nope: 1.0}",
            "rewards: unknown reward 'nope'; allowed: brightness, clipscore, colorfulness, ",
        ),
        (
            "plugins=[no_such_plugin_module]",
            "plugins: cannot import 'no_such_plugin_module' (No module named ",
        ),
    ],
)
def test_unknown_names_are_one_line_errors_naming_the_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_unknown_names_raise_in_the_engine_too() -> None:
    with pytest.raises(ValueError, match=r"^algorithm: must be one of flow-grpo, dance, cps, got 'ddim'$"):
        SamplerConfig(kind="ddim")
    from jagg_engine.backbones import build_backbone

    with pytest.raises(
        BackboneConfigError, match=r"^backbone: unknown backbone 'sdxl'; allowed: tiny-shapes, "
    ):
        build_backbone("sdxl")
    with pytest.raises(rewards.RewardConfigError, match=r"^reward: unknown reward 'nope'; allowed: "):
        rewards.build_reward("nope")


def test_registered_names_join_the_allowed_lists(registered) -> None:
    with pytest.raises(ConfigError, match=rf"^algorithm: must be one of .*, {SDE}, got 'ddim'$"):
        load_config(None, ["algorithm=ddim"])
    with pytest.raises(ConfigError, match=rf"^backbone: must be one of .*, {BACKBONE}, got 'sdxl'$"):
        load_config(None, ["backbone=sdxl"])
    # The backbone's factory signature checks its backbone_options; a field it does not read is refused.
    with pytest.raises(ConfigError, match=r"^backbone_options.width: unknown option; allowed: dim$"):
        load_config(None, [f"backbone={BACKBONE}", "backbone_options={width: 4}"])
    with pytest.raises(ConfigError, match=rf"^cfg_scale: backbone '{BACKBONE}' does not use it"):
        load_config(None, [f"backbone={BACKBONE}", "cfg_scale=2.0"])


@pytest.mark.slow
def test_readme_plugin_registers_in_every_process_of_jagg_train(tmp_path: Path) -> None:
    """README's plugin example: a user's module named in ``plugins`` registers an SDE kind, a reward and a
    backbone; README's `jagg train` command (its launcher and the trainer process it starts both import the
    module) trains one step with all three."""
    section = docs_section("Extending")
    code = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    command = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    (tmp_path / "my_plugin.py").write_text(code + "\n")
    env_assignment, jagg, *args = shlex.split(command)
    assert (env_assignment, jagg) == ("PYTHONPATH=.", "jagg")
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": f".:{REPO}"}  # README's PYTHONPATH=., and this checkout's package
    cmd = [sys.executable, "-m", "jagg_engine.cli", *args, *ONE_STEP, "--runs-dir", str(runs)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    store = open_store(runs)
    (run,) = store.list_runs()
    assert run["status"] == "finished"
    config = json.loads(run["config"]) if isinstance(run["config"], str) else run["config"]
    assert (config["backbone"], config["algorithm"], config["plugins"]) == (
        "toy",
        "euler-maruyama",
        ["my_plugin"],
    )
    frame = store.metrics_frame(run["id"])
    assert frame.loc[frame["step"] == 1, "reward/redness/mean"].notna().all()


def test_rewards_are_found_by_importing_the_package_without_optional_dependencies() -> None:
    """Every reward module of the package registers something (no hand-kept list), and listing them needs no
    optional dependency: with open_clip and transformers made unimportable, every built-in reward is found."""
    import pkgutil

    import jagg_engine.rewards

    names = rewards.available_rewards()
    modules = {rewards._REGISTRY[n].factory.__module__.rsplit(".", 1)[-1] for n in names}
    files = {m.name for m in pkgutil.iter_modules(jagg_engine.rewards.__path__)} - {"registry"}
    assert files <= modules, f"reward modules that register nothing: {files - modules}"
    code = (
        "import sys\n"
        "for name in ('open_clip', 'transformers', 'hpsv2'): sys.modules[name] = None\n"
        "from jagg_engine.rewards.registry import available_rewards\n"
        "print(','.join(available_rewards()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    builtin = [n for n in names if rewards._REGISTRY[n].factory.__module__.startswith("jagg_engine.rewards.")]
    assert out.stdout.strip().split(",") == builtin


def test_listing_every_registry_imports_no_torch() -> None:
    """The app's lists and the config's names come from the registries without importing torch."""
    code = (
        "import sys\n"
        "from jagg_engine.backbones import BACKBONES\n"
        "from jagg_engine.train.config import ALGORITHMS\n"
        "print(sorted(n for n, s in BACKBONES.items() if s.in_app), list(ALGORITHMS), 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [
        "['flux',",
        "'qwen-image',",
        "'sd3',",
        "'tiny-flux',",
        "'tiny-shapes']",
        "['flow-grpo',",
        "'dance',",
        "'cps']",
        "False",
    ]


def test_flags_and_the_diffusers_factory_come_from_the_entries() -> None:
    import inspect

    from jagg_engine import bench
    from jagg_engine.backbones import flux, get_backbone
    from jagg_engine.backbones.flux_core import BenchFlux

    assert bench.bench_backbones() == ("tiny-shapes", "flux", "tiny-flux", "bench-flux")
    assert get_backbone("bench-flux").factory_fn() is BenchFlux
    # One diffusers factory: its signature lists the adapter's options and the shared LoRA/precision ones, and
    # an unknown option is refused before any folder is read.
    params = inspect.signature(flux.build).parameters
    assert {"model_path", "device", "dtype", "resolution", "guidance", "lora_rank", "reference_copy"} <= set(
        params
    )
    with pytest.raises(BackboneConfigError, match=r"^flux: got an unexpected keyword argument 'rank'$"):
        flux.build("/nowhere", rank=4)


def test_a_space_imports_no_visitor_plugin() -> None:
    """A public Space keeps the shipped plugins (none): the check runs before the config is validated, so a
    visitor's module name is refused without being imported."""
    import dataclasses

    from app.space import CAPS, check_space_config

    cfg = dataclasses.replace(TrainConfig(), steps=CAPS["steps"], plugins=["no_such_plugin_module"])
    with pytest.raises(ConfigError, match=r"^plugins: this Space keeps the shipped value \[\], got \["):
        check_space_config(cfg)


def test_a_plugin_that_fails_to_import_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "jagg_broken_plugin.py").write_text("raise RuntimeError('registers nothing\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        load_config(None, ["plugins=[jagg_broken_plugin]"])
    assert str(err.value) == (
        "plugins: importing 'jagg_broken_plugin' failed: RuntimeError: registers nothing second line"
    )


def test_a_registered_bench_backbone_is_offered_and_built_by_jagg_bench(registries) -> None:
    """`jagg bench` reads the entry: the flag puts it on the list, and the factory gets the seed, dtype and
    device its signature takes, random weights when it offers them, the model path through the option the
    entry reads from model_path."""
    from jagg_engine import bench

    built = []

    def factory(
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
        weights: str | None = None,
        random_weights: bool = False,
    ) -> LinearToy:
        built.append((seed, dtype, weights, random_weights))
        return LinearToy(dim=4, seed=seed, dtype=dtype)

    register_backbone("test-bench-toy", factory, options={"weights": "model_path"}, bench=True)
    assert "test-bench-toy" in bench.bench_backbones()
    model = bench.build_bench_backbone("test-bench-toy", torch.device("cpu"), torch.float32, 3, None)
    model = bench.build_bench_backbone("test-bench-toy", torch.device("cpu"), torch.float32, 3, "/w")
    assert built == [(3, torch.float32, None, True), (3, torch.float32, "/w", False)]
    assert model.theta0.dtype == torch.float32
    with pytest.raises(ValueError, match=r"^backbone: must be one of tiny-shapes, .*, got 'test-other'$"):
        bench.build_bench_backbone("test-other", torch.device("cpu"), torch.float32, 0, None)

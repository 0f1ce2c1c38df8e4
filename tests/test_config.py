"""TrainConfig: shipped configs validate, each bad field gives one line, overrides parse, round trips."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from jagg_engine.rewards import registry
from jagg_engine.train.config import (
    ConfigError,
    TrainConfig,
    field_table,
    load_config,
    model_path_kind,
    read_prompts,
)

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
TEST_REWARD = "config-test-reward"


def _check_test_reward(weights: str | None = None) -> None:
    if weights is not None and not Path(weights).exists():
        raise registry.RewardConfigError(f"{TEST_REWARD}: weight file not found: {weights}")


@pytest.fixture
def cfg(monkeypatch: pytest.MonkeyPatch) -> TrainConfig:
    """A valid config whose reward is a registered test reward (independent of the reward modules)."""
    spec = registry.RewardSpec(factory=lambda **_: None, check=_check_test_reward)
    monkeypatch.setitem(registry._REGISTRY, TEST_REWARD, spec)
    return TrainConfig(rewards={TEST_REWARD: 1.0})


def _error(cfg: TrainConfig, overrides: list[str], check_environment: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        cfg.apply_overrides(overrides).validate(check_environment=check_environment)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------- shipped configs


def test_every_expected_config_is_shipped() -> None:
    names = {p.name for p in CONFIGS}
    assert {"tiny-shapes-cpu.yaml", "flux-lora.yaml", "qwen-image-lora-fsdp.yaml", "sd3-lora.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_validates(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith(f"# jagg train configs/{path.name}"), first
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    # Every key is spelled out, so the file documents the whole setting.
    assert set(data) == {f["name"] for f in field_table()}

    gpu = data["backbone"] in ("flux", "qwen-image", "sd3")
    if gpu:
        # A GPU config names a hub id (accepted without a download) and gets its prompts file on the command
        # line. The reward's dependency and weights are not on a CPU test machine, so the environment checks
        # are left out; a reward module not written yet is stood in for here (see the next test).
        assert model_path_kind(data["model_path"]) == "hub"
        for name in data["rewards"]:
            if name not in registry.available_rewards():
                monkeypatch.setitem(registry._REGISTRY, name, registry.RewardSpec(factory=lambda **_: None))
        prompts = tmp_path / "prompts.txt"
        prompts.write_text("a photo of a cat\na watercolor of a lighthouse\n")
        cfg = load_config(str(path), [f"prompts_file={prompts}"], check_environment=False)
        assert cfg.precision == "bf16" and cfg.lora_rank > 0
    else:
        if any(name not in registry.available_rewards() for name in data["rewards"]):
            pytest.skip(f"a reward of {path.name} is not registered yet")
        cfg = load_config(str(path), [])  # full validation, environment included
    assert cfg.name == data["name"]

    # The key=value overrides of the command in the first line are valid too.
    command = shlex.split(first.lstrip("# "))
    overrides = [tok for tok in command[3:] if "=" in tok and not tok.startswith("-")]
    cfg.apply_overrides(overrides).validate(check_environment=False)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_rewards_are_registered(path: Path) -> None:
    rewards = yaml.safe_load(path.read_text(encoding="utf-8"))["rewards"]
    missing = [name for name in rewards if name not in registry.available_rewards()]
    if missing and not (Path(registry.__file__).parent / f"{missing[0]}.py").exists():
        pytest.skip(f"reward(s) {', '.join(missing)} not registered yet (jagg_engine/rewards)")
    assert not missing, f"{path.name} names unregistered reward(s) {missing}"


def test_tiny_shapes_config_is_the_setting_that_learned() -> None:
    data = yaml.safe_load((Path(__file__).parents[1] / "configs" / "tiny-shapes-cpu.yaml").read_text())
    cfg = TrainConfig.from_dict(data)
    assert (cfg.sampling_steps, cfg.eta, cfg.sde_window(), cfg.group_size, cfg.prompts_per_step) == (
        12,
        0.7,
        (0, 4),
        8,
        18,
    )
    assert (cfg.adv_std, cfg.adv_clip, cfg.clip_range, cfg.lr, cfg.weight_decay, cfg.grad_clip) == (
        "centered",
        5.0,
        1e-3,
        5e-5,
        1e-4,
        1.0,
    )
    # The default (README "Time to quality", (f)): the first W = 4 steps trained every step, one JAGG group a
    # step, every sample its own noise, DPM-Solver++ for at most 4 steps after the window.
    assert (cfg.sde_window_schedule, cfg.window, cfg.window_last_start) == ("fixed", 4, None)
    assert (cfg.strategy, cfg.reuse_rollout_velocity, cfg.group_noise) == ("jagg", "auto", "independent")
    assert (cfg.ode_solver, cfg.ode_steps_before, cfg.ode_steps_after) == ("dpmpp-2m", None, 4)
    assert cfg.num_trained_steps == 4 and cfg.num_windows == 1
    assert [cfg.sde_window_at(step) for step in (1, 6, 21, 26)] == [(0, 4)] * 4
    # The form's defaults (schedule null = the backbone's default, shifted-linear for tiny-shapes).
    assert cfg.to_dict() == {
        **TrainConfig().to_dict(),
        "name": "tiny-shapes-cpu",
        "schedule": "shifted-linear",
    }


# ---------------------------------------------------------------------- one-line errors


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["window=1"],
            "window: must be an integer >= 2 for strategy jagg (a one-step window trains with strategy=exact), got 1",
        ),
        (["strategy=fast"], "strategy: must be one of exact, jagg, endpoint, pair, got 'fast'"),
        (["algorithm=ddim"], "algorithm: must be one of flow-grpo, dance, cps, got 'ddim'"),
        (["adv_std=batch"], "adv_std: must be one of group, global, centered, group-unbiased, got 'batch'"),
        (["precision=fp16"], "precision: must be one of fp32, bf16, got 'fp16'"),
        (["endpoint_backward=both"], "endpoint_backward: must be one of joint, sequential, got 'both'"),
        (["kl_form=closed"], "kl_form: must be one of flow-grpo, gaussian, got 'closed'"),
        (["cps_log_prob=full"], "cps_log_prob: must be one of flow-grpo, gaussian, got 'full'"),
        (["jagg_frac=1.5"], "jagg_frac: must be a number in [0, 1], got 1.5"),
        (["eta=0"], "eta: must be a number in (0, 10], got 0.0"),
        (["algorithm=cps", "eta=1.5", "sde_window_end=null"], "eta: cps needs 0 < eta <= 1, got 1.5"),
        (["lr=0"], "lr: must be a number in (0, 1], got 0.0"),
        (["weight_decay=-1"], "weight_decay: must be a number in [0, 1], got -1.0"),
        (["steps=0"], "steps: must be an integer >= 1, got 0"),
        (["group_size=1"], "group_size: must be an integer >= 2, got 1"),
        (["clip_range=0"], "clip_range: must be a number in (0, 1], got 0.0"),
        (["adv_clip=-5"], "adv_clip: must be a number in (0, 1000], got -5.0"),
        (["sample_every=-1"], "sample_every: must be an integer >= 0, got -1"),
        (
            ["backbone=sdxl"],
            "backbone: must be one of tiny-shapes, flux, qwen-image, sd3, tiny-flux, bench-flux, linear-toy",
        ),
        (["sde_window_end=13"], "sde_window_end: must be in 1..12"),
        (["sde_window_start=8"], "sde_window_end: must be in 9..12"),
        (["sde_window_start=12", "sde_window_end=null"], "sde_window_start: must be in 0..11"),
        (["algorithm=cps", "sde_window_end=12"], "sde_window_end: must be in 1..11"),
        (["window=9"], "window: must be at most the number of trained steps (4 = sde_window_end"),
        (["processes=4"], "prompts_per_step: must be a multiple of processes (4), got 18"),
        (["lora_targets=[to_q]"], "lora_targets: only used with LoRA"),
        (["lora_rank=4", "lora_alpha=0"], "lora_alpha: must be a number in (0, 100000], got 0.0"),
        (["eval_seeds=[]"], "eval_seeds: must be a non-empty list of integers, got []"),
        (["eval_seeds=[0, 0]"], "eval_seeds: must not repeat a seed, got [0, 0]"),
        (["rewards={}"], "rewards: must name at least one reward"),
        (["rewards={no-such-reward: 1.0}"], "rewards: unknown reward 'no-such-reward'; allowed: "),
        (["rewards={config-test-reward: 0}"], "rewards: at least one weight must be non-zero"),
        (
            ["reward_options={other: {a: 1}}"],
            "reward_options: 'other' is not in rewards; allowed: config-test-reward",
        ),
        (["prompts_file=prompts.csv"], "prompts_file: must be a .txt or .jsonl file, got 'prompts.csv'"),
        (["backbone=flux"], "prompts_file: required for backbone 'flux'"),
        (["strategy=exact", "probe_every=5"], "probe_every: probes compare JAGG with exact"),
        (["name= "], "name: must be a non-empty string"),
    ],
)
def test_bad_field_gives_one_line_naming_it(cfg: TrainConfig, overrides: list[str], message: str) -> None:
    assert _error(cfg, overrides).startswith(message)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("windw=4", "unknown field 'windw'; did you mean 'window'?"),
        ("jag_frac=0.5", "unknown field 'jag_frac'; did you mean 'jagg_frac'?"),
        ("zzz=1", "unknown field 'zzz'; run `jagg train --help` for the list"),
        ("window", "override 'window': must look like name=value"),
        ("lr=abc", "lr: must be a float, got 'abc'"),
        ("window=4.5", "window: must be an int, got '4.5'"),
        ("grad_clip=big", "grad_clip: must be a float or null, got 'big'"),
        ("fsdp=maybe", "fsdp: must be true or false, got 'maybe'"),
        ("eval_seeds=3", "eval_seeds: must be a list, got 3"),
        ("eval_seeds=[a]", "eval_seeds[0]: must be an int, got 'a'"),
        ("rewards=[a]", "rewards: must be a mapping, got ['a']"),
        ("rewards={a: x}", "rewards.a: must be a float, got 'x'"),
        ("rewards={a: [}", "rewards: must be a mapping written in YAML, got '{a: [}'"),
        ("steps=null", "steps: must be an int, got 'null'"),
    ],
)
def test_bad_override_gives_one_line(cfg: TrainConfig, override: str, message: str) -> None:
    assert _error(cfg, [override]) == message


def test_yaml_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("window: [1,\n")
    with pytest.raises(ConfigError, match=r"^config file: .* is not valid YAML") as info:
        load_config(str(bad), [])
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="^config file: cannot read"):
        load_config(str(tmp_path / "missing.yaml"), [])
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(
        ConfigError, match=r"^config file: .* must be a mapping of field names to values, got list"
    ):
        load_config(str(bad), [])
    bad.write_text("windw: 4\n")
    with pytest.raises(ConfigError, match="^unknown field 'windw'; did you mean 'window'"):
        load_config(str(bad), [], check_environment=False)


# ---------------------------------------------------------------------- environment checks


def test_prompts_files_are_read_and_checked(cfg: TrainConfig, tmp_path: Path) -> None:
    txt = tmp_path / "p.txt"
    txt.write_text("a red circle left\n\n  a blue square top  \n")
    assert read_prompts(txt) == ["a red circle left", "a blue square top"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a cat"}\n{"prompt": "a dog", "id": 2}\n')
    assert read_prompts(jsonl) == ["a cat", "a dog"]
    cfg.apply_overrides(
        [f"prompts_file={txt}", f"eval_prompts_file={jsonl}", "eval_num_prompts=2"]
    ).validate()

    assert _error(cfg, [f"prompts_file={tmp_path / 'nope.txt'}"], True) == (
        f"prompts_file: no such file: {tmp_path / 'nope.txt'}"
    )
    jsonl.write_text('{"prompt": "a cat"}\n{"text": "a dog"}\n')
    assert (
        _error(cfg, [f"prompts_file={jsonl}"], True)
        == f"prompts_file: {jsonl} line 2 needs a string 'prompt' key"
    )
    jsonl.write_text("a cat\n")
    assert (
        _error(cfg, [f"eval_prompts_file={jsonl}"], True) == f"eval_prompts_file: {jsonl} line 1 is not JSON"
    )
    assert _error(cfg, [f"eval_prompts_file={txt}"], True) == (
        f"eval_num_prompts: must be at most the 2 prompts in {txt}, got 90"
    )
    txt.write_text("\n\n")
    assert _error(cfg, [f"prompts_file={txt}"], True) == f"prompts_file: {txt} holds no prompts"


def test_model_path_local_hub_or_missing(
    cfg: TrainConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert model_path_kind("model.safetensors") == "local"
    assert model_path_kind(str(tmp_path)) == "local"
    assert model_path_kind("black-forest-labs/FLUX.1-dev") == "hub"
    assert model_path_kind("checkpoints/tiny") == "missing"  # its first component is a local folder
    for missing in ("./nope", "/no/such/dir", "~/nope-xyz", "nope.safetensors", "a/b/c"):
        assert model_path_kind(missing) == "missing", missing

    (tmp_path / "p.txt").write_text("a cat\n")
    flux = ["backbone=flux", "prompts_file=p.txt", "eval_num_prompts=1"]
    cfg.apply_overrides([*flux, "model_path=black-forest-labs/FLUX.1-dev"]).validate()
    assert _error(cfg, ["model_path=./nope"], True) == "model_path: no such file or folder: ./nope"
    cfg.apply_overrides(["model_path=./nope"]).validate(check_environment=False)
    # A path that exists must hold what the backbone loads.
    assert _error(cfg, [*flux, "model_path=model.safetensors"], True).startswith(
        "model_path: model.safetensors holds no flux pipeline (missing the folder"
    )
    assert _error(cfg, [*flux, "model_path=checkpoints"], True) == (
        "model_path: checkpoints holds no flux pipeline (missing model_index.json); pass a diffusers pipeline folder"
    )
    assets = Path(__file__).parents[1] / "assets" / "tiny-shapes"
    cfg.apply_overrides([f"model_path={assets}"]).validate()
    assert _error(cfg, ["model_path=checkpoints"], True) == (
        "model_path: checkpoints holds no tiny-shapes weights (missing transformer/config.json, "
        "text_embedding.safetensors, vocab.json)"
    )


def test_reward_check_failure_is_a_config_error(cfg: TrainConfig, tmp_path: Path) -> None:
    opts = f"reward_options={{{TEST_REWARD}: {{weights: {tmp_path / 'w.pt'}}}}}"
    assert _error(cfg, [opts], True) == f"rewards: {TEST_REWARD}: weight file not found: {tmp_path / 'w.pt'}"
    (tmp_path / "w.pt").write_bytes(b"")
    assert cfg.apply_overrides([opts]).validate().reward_options == {
        TEST_REWARD: {"weights": str(tmp_path / "w.pt")}
    }


# ---------------------------------------------------------------------- parsing and round trips


def test_overrides_are_parsed_with_the_field_type(cfg: TrainConfig) -> None:
    out = cfg.apply_overrides(
        [
            "steps=3",
            "window=4",
            "jagg_frac=0.6",
            "output_dir=runs",
            "lr=3e-5",
            "grad_clip=null",
            "fsdp=true",
            "gradient_checkpointing=0",
            "name=001",
            "model_path=a=b",
            "eval_seeds=[3, 4]",
            "rewards={config-test-reward: 2}",
            "reward_options={config-test-reward: {size: 3, mode: fast}}",
            "lora_rank=8",
            "lora_targets=[to_q, to_k]",
            "sde_window_end=None",
            "sde_window_schedule=fixed",
        ]
    )
    assert (out.steps, out.window, out.jagg_frac, out.lr, out.grad_clip) == (3, 4, 0.6, 3e-5, None)
    assert out.fsdp is True and out.gradient_checkpointing is False
    assert out.name == "001" and out.model_path == "a=b"
    assert out.eval_seeds == [3, 4] and out.rewards == {TEST_REWARD: 2.0}
    assert isinstance(out.rewards[TEST_REWARD], float)
    assert out.reward_options == {TEST_REWARD: {"size": 3, "mode": "fast"}}
    assert out.lora_targets == ["to_q", "to_k"]
    assert out.sde_window() == (0, 12) and out.num_windows == 3
    assert cfg.steps == 40  # the original is untouched
    # LoRA, fsdp and a model path are used by the diffusers backbones with more than one process.
    out.apply_overrides(["backbone=flux", "processes=2", "prompts_file=p.txt"]).validate(
        check_environment=False
    )


def test_yaml_values_are_typed_and_overrides_win(cfg: TrainConfig, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    # PyYAML reads 1e-4 (no dot) as a string and 4.0 as a float: both are parsed by the field's type.
    path.write_text(f"rewards: {{{TEST_REWARD}: 1}}\nlr: 1e-4\nwindow: 4.0\nsteps: 7\n")
    out = load_config(str(path), ["steps=9"])
    assert out.lr == 1e-4 and isinstance(out.lr, float)
    assert out.window == 4 and isinstance(out.window, int)
    assert out.steps == 9
    path.write_text("fsdp: 1.5\n")
    with pytest.raises(ConfigError, match=r"^fsdp: must be true or false, got 1.5$"):
        load_config(str(path), [])
    path.write_text("steps: null\n")
    with pytest.raises(ConfigError, match=r"^steps: must not be null$"):
        load_config(str(path), [])
    path.write_text("steps: true\n")
    with pytest.raises(ConfigError, match=r"^steps: must be an int, got True$"):
        load_config(str(path), [])


def test_round_trip_dict_yaml_json(cfg: TrainConfig) -> None:
    cfg = cfg.apply_overrides(["lr=3e-5", "eval_seeds=[5]", "reward_options={config-test-reward: {k: 1}}"])
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert TrainConfig.from_dict(yaml.safe_load(cfg.to_yaml())) == cfg
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # as stored in the run store
    assert list(yaml.safe_load(cfg.to_yaml())) == [f["name"] for f in field_table()]
    assert TrainConfig.from_dict({}) == TrainConfig()


def test_every_field_has_help() -> None:
    table = field_table()
    names = {row["name"] for row in table}
    required = """name backbone model_path prompts_file eval_prompts_file eval_num_prompts eval_seeds rewards
        reward_options algorithm eta sampling_steps shift sde_window_start sde_window_end cfg_scale group_size
        prompts_per_step window jagg_frac strategy endpoint_backward lr weight_decay grad_clip clip_range adv_clip
        adv_std beta lora_rank lora_alpha lora_targets gradient_checkpointing precision fsdp seed steps
        sample_every eval_every checkpoint_every probe_every output_dir processes""".split()
    assert not set(required) - names
    for row in table:
        assert row["help"].strip(), row["name"]


def test_engine_configs_are_built() -> None:
    pytest.importorskip("jagg_engine.sde")
    pytest.importorskip("jagg_engine.jagg")
    cfg = TrainConfig()
    sampler = cfg.sampler_config()
    assert (sampler.kind, sampler.num_steps, sampler.eta, sampler.shift, sampler.sde_window) == (
        "flow-grpo",
        12,
        0.7,
        1.0,
        (0, 4),
    )
    assert (sampler.ode_solver, sampler.ode_steps_before, sampler.ode_steps_after) == ("dpmpp-2m", None, 4)
    assert len(sampler.sde_steps()) == cfg.num_trained_steps == 4
    fixed = cfg.apply_overrides(["sde_window_end=8"])  # Flow-GRPO's range: every step of 0..7 trained
    assert fixed.sampler_config(step=26).sde_window == (0, 8) and fixed.num_trained_steps == 8
    sliding = cfg.apply_overrides(["sde_window_end=8", "sde_window_schedule=sliding"])  # MixGRPO's window
    assert [sliding.sde_window_at(step) for step in (1, 6, 21, 26)] == [(0, 4), (1, 5), (4, 8), (0, 4)]
    every = fixed.apply_overrides(["algorithm=cps", "sde_window_start=null", "sde_window_end=null"])
    assert every.sampler_config().sde_window is None
    assert len(every.sampler_config().sde_steps()) == every.num_trained_steps == 11
    update = cfg.apply_overrides(
        ["strategy=endpoint", "window=3", "jagg_frac=0.6", "beta=0.1"]
    ).update_config()
    assert (update.strategy, update.window, update.jagg_frac, update.endpoint_backward) == (
        "endpoint",
        3,
        0.6,
        "joint",
    )
    assert (update.clip_range, update.beta) == (1e-3, 0.1)
    assert (update.kl_form, sampler.cps_log_prob) == ("flow-grpo", "flow-grpo")  # the reference codes' forms
    other = cfg.apply_overrides(["kl_form=gaussian", "cps_log_prob=gaussian"])
    assert (other.update_config().kl_form, other.sampler_config().cps_log_prob) == ("gaussian", "gaussian")

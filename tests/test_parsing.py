"""Parsing that cannot be bombed: every YAML a user hands the project (a config file, ``key=value``
overrides, the app's and the Space's overrides box) goes through :mod:`jagg_engine.safe_yaml` — size first,
then no anchors or aliases, no duplicate keys, a depth limit — before any other check. Also the float bounds
(``lr=1e308``), a runs folder with a newline, ``plugins: [this]`` and ``jagg runs | head``.

The bombs are the real ones: a depth-8 "billion laughs" document (9^9 ≈ 387 million strings once expanded;
whatever walks the result of PyYAML's plain ``safe_load`` spends minutes and gigabytes on it), a 50 MB
file, 1000 nested lists.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
import tracemalloc
import typing
from pathlib import Path

import pytest
from docs_pages import all_text as docs_text

from app.form import form_config
from jagg_engine import cli, safe_yaml
from jagg_engine.train.config import FLOAT_BOUNDS, ConfigError, TrainConfig, check_runs_dir, load_config

ROOT = Path(__file__).parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def bomb_block(depth: int = 8) -> str:
    """The classic alias bomb in block style: each level a list of 9 aliases of the level before."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, depth + 1):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def bomb_flow(depth: int = 8) -> str:
    """The same bomb as one flow mapping: fits one ``rewards={...}`` override or one line of a text box."""
    items = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, depth + 1):
        items.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "{" + ", ".join(items) + "}"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def refused_small(call: typing.Callable[[], object], match: str) -> str:
    """Run ``call``; it must raise ConfigError (one line matching ``match``) within 50 MB of Python allocations
    (tracemalloc's peak) and 50 MB of process RSS growth: a bomb expanded, or a big file read, would take more
    (no wall-clock bound: the machine may be busy). Returns the message."""
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as info:
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    assert match in message, message
    assert peak <= 50 * 1024**2 and grown <= 50 * 1024**2, (peak, grown)
    return message


def test_plain_safe_load_does_expand_the_bomb() -> None:
    """The fault is real: PyYAML's safe_load returns the aliases as shared references, so whatever walks the
    result (the typed parser, the stored config's JSON, an error message quoting it) visits 9^(d+1) strings:
    59,049 for a 4-level bomb of 5 lines, 387 million at depth 8. The loader here refuses the first anchor."""
    import yaml

    def leaves(value: object) -> int:
        return sum(leaves(v) for v in value) if isinstance(value, list) else 1

    assert leaves(yaml.safe_load(bomb_block(4))["l4"]) == 9**5
    with pytest.raises(safe_yaml.YamlRefused, match="anchor &l0 at line 1, column 5"):
        safe_yaml.load(bomb_block(4), "config file")


def test_an_alias_bomb_in_a_config_file_is_refused_before_it_expands(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text("steps: 3\n" + bomb_block(8))
    refused_small(lambda: load_config(str(path), []), "anchors and aliases are not allowed")
    path.write_text("steps: 3\nname: *nothing\n")  # an alias alone (no anchor before it)
    refused_small(lambda: load_config(str(path), []), "alias *nothing at line 2")
    path.write_text("steps: 3\n<<: {window: 4}\n")
    refused_small(lambda: load_config(str(path), []), "merge keys are not allowed")


@pytest.mark.parametrize("field", ["rewards", "reward_options", "backbone_options", "eval_seeds", "plugins"])
def test_an_alias_bomb_in_an_override_is_refused_before_it_expands(field: str) -> None:
    refused_small(lambda: load_config(None, [f"{field}={bomb_flow(8)}"]), f"{field}: anchor &a0")


def test_an_alias_bomb_in_the_app_and_space_overrides_box_is_refused_before_it_expands(
    tmp_path: Path,
) -> None:
    form = ("t", "tiny-shapes", "", "shapes-dense: 1", "flow-grpo", 4, 0.5, 0.0, 0, "jagg", 3, 4, 1e-4, 0, 1)
    for space in (False, True):
        for box in (f"rewards={bomb_flow(8)}", f"reward_options={bomb_flow(8)}"):
            refused_small(
                lambda b=box, s=space: form_config(tmp_path, *form, b, space_mode=s), "anchors and aliases"
            )


def test_a_50_mb_yaml_is_refused_without_being_read(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("w") as f:
        f.write("steps: 3\nprompts:\n")
        line = "  - a red circle on the left of a blue square\n"
        f.write(line * (50 * 1024**2 // len(line) + 1))
    assert path.stat().st_size >= 50 * 1024**2
    message = refused_small(lambda: load_config(str(path), []), "over the limit of 262,144 bytes")
    assert message.startswith(f"config file: {path} is 52,428,8")
    # A file whose size the filesystem does not know (a FIFO, /dev/zero) is read only up to the limit.
    refused_small(lambda: load_config("/dev/zero", []), "config file: /dev/zero is over the limit")


def test_an_oversized_override_and_overrides_box_are_refused_before_parsing(tmp_path: Path) -> None:
    big = "x" * (safe_yaml.OVERRIDES_MAX_BYTES + 1)
    refused_small(lambda: load_config(None, [f"name={big}"]), "over the limit of 65,536 bytes")
    form = ("t", "tiny-shapes", "", "shapes-dense: 1", "flow-grpo", 4, 0.5, 0.0, 0, "jagg", 3, 4, 1e-4, 0, 1)
    message = refused_small(
        lambda: form_config(tmp_path, *form, "# " + big, space_mode=True), "over the limit"
    )
    assert message.startswith("overrides: 65,539 bytes is over the limit of 65,536 bytes")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "steps: 3\nsteps: 4\n",
            "config file: duplicate key 'steps' at line 2, column 1: each key may appear once",
        ),
        (
            "rewards:\n  shapes: 1\n  shapes: 2\n",
            "config file: duplicate key 'shapes' at line 3, column 3: each key may appear once",
        ),
        (f"eval_seeds: {nested(1000)}\n", "config file: nesting deeper than 16 lists/mappings at line 1"),
        (
            "backbone_options:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 40)),
            "config file: nesting deeper than 16",
        ),
    ],
    ids=["top-level", "nested", "depth-1000", "block-depth-40"],
)
def test_duplicate_keys_and_deep_nesting_in_a_file_are_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert refused_small(lambda: load_config(str(path), []), message).startswith(message)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rewards={shapes: 1, shapes: 2}", "rewards: duplicate key 'shapes' at line 1, column 13"),
        (f"eval_seeds={nested(1000)}", "eval_seeds: nesting deeper than 16 lists/mappings"),
        ("reward_options={a: {b: &x 1}}", "reward_options: anchor &x at line 1"),
    ],
)
def test_duplicate_keys_and_deep_nesting_in_an_override_are_one_line(override: str, message: str) -> None:
    assert refused_small(lambda: load_config(None, [override]), message).startswith(message)


def test_the_real_command_line_refuses_a_bomb_and_a_deep_file_in_one_line(tmp_path: Path) -> None:
    """`jagg train` in a subprocess: exit 2, one line on stderr, no traceback, nothing written."""
    runs = tmp_path / "runs"
    cases = {
        "bomb.yaml": (bomb_block(8), "anchor &l0 at line 1"),
        "dup.yaml": ("window: 4\nwindow: 2\n", "duplicate key 'window'"),
        "deep.yaml": (f"eval_seeds: {nested(1000)}\n", "nesting deeper than 16"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        argvs = [[str(tmp_path / name)]]
        if name == "bomb.yaml":
            argvs.append([f"rewards={bomb_flow(8)}"])
            message = "anchor &"
        for argv in argvs:
            proc = subprocess.run(
                [sys.executable, "-m", "jagg_engine.cli", "train", *argv, "--runs-dir", str(runs)],
                capture_output=True, text=True, env=ENV, timeout=120,
            )  # fmt: skip
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1, proc.stderr
            assert lines[0].startswith("jagg train: error: ") and message in lines[0], lines[0]
    assert not runs.exists()


def test_the_shipped_configs_still_load() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        data = safe_yaml.load_file(path, "config file")
        assert isinstance(data, dict) and data


# ---------------------------------------------------------------------------------------------- bounds


def test_every_float_field_has_bounds() -> None:
    """A float field added later must get its bounds (FLOAT_BOUNDS) — the validator looks them up."""
    hints = typing.get_type_hints(TrainConfig)
    floats = {f.name for f in dataclasses.fields(TrainConfig) if hints[f.name] in (float, float | None)}
    assert floats == set(FLOAT_BOUNDS), floats ^ set(FLOAT_BOUNDS)
    readme = " ".join(docs_text().split())  # README.md and the docs pages
    for name, (low, high, closed) in FLOAT_BOUNDS.items():
        assert f"`{name}` {'[' if closed else '('}{low:g}, {high:g}]" in readme, name


@pytest.mark.parametrize("name", sorted(FLOAT_BOUNDS))
def test_a_float_past_its_bound_is_refused_in_one_line(name: str) -> None:
    low, high, closed = FLOAT_BOUNDS[name]
    overrides = ["backbone=flux", "lora_rank=4", "prompts_file=p.txt"] if name == "lora_alpha" else []
    if name == "auto_route_threshold":
        overrides.append("auto_route=true")
    for bad in (high * 10 if high > 0 else 1.0, 1e308, low - 1 if closed else low):
        with pytest.raises(ConfigError) as info:
            load_config(None, [*overrides, f"{name}={bad!r}"], check_environment=False)
        expected = f"{name}: must be a number in {'[' if closed else '('}{low:g}, {high:g}], got {float(bad)}"
        assert str(info.value) == expected
    load_config(None, [*overrides, f"{name}={high!r}"], check_environment=False)  # the bound itself is in


def test_lr_1e308_is_refused_by_cli_app_and_space(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    message = "lr: must be a number in (0, 1], got 1e+308"
    assert cli.main(["train", "lr=1e308", "--runs-dir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err.strip() == f"jagg train: error: {message}"
    form = (
        "t",
        "tiny-shapes",
        "",
        "shapes-dense: 1",
        "flow-grpo",
        4,
        0.5,
        0.0,
        0,
        "jagg",
        3,
        4,
        1e308,
        0,
        1,
        "",
    )
    for space in (False, True):
        with pytest.raises(ConfigError, match=r"^lr: must be a number in \(0, 1\], got 1e\+308$"):
            form_config(tmp_path / "runs", *form, space_mode=space)
    with pytest.raises(ConfigError, match=r"^lr: must be a number in \(0, 1\]"):  # through the overrides box
        form_config(tmp_path / "runs", *form[:-1], "lr=1e308", space_mode=True)
    assert not (tmp_path / "runs").exists()


def test_reward_weights_are_bounded() -> None:
    with pytest.raises(
        ConfigError, match=r"^rewards: weight of 'shapes-dense' must be a number in \[-1000, 1000\]"
    ):
        load_config(None, ["rewards={shapes-dense: 1e300}"], check_environment=False)


# ---------------------------------------------------------------------------------------------- the rest


@pytest.mark.parametrize("bad", ["runs\nfake", "runs\tx", "runs\rx", "runs\x1b[31m"])
def test_a_runs_folder_with_a_newline_or_control_character_is_refused(tmp_path: Path, bad: str) -> None:
    target = tmp_path / bad
    with pytest.raises(ConfigError, match=r"^output_dir: must be a folder path of printable characters"):
        check_runs_dir(target)
    with pytest.raises(ConfigError, match=r"^output_dir: must be a folder path of printable characters"):
        TrainConfig(output_dir=str(target)).validate(check_environment=False)
    proc = subprocess.run(
        [sys.executable, "-m", "jagg_engine.cli", "train", "steps=1", "--runs-dir", str(target)],
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("jagg train: error: --runs-dir: must be a folder path of printable characters")
    proc = subprocess.run(
        [sys.executable, "launch.py", "--runs-dir", str(target), "--port", "1"],
        capture_output=True, text=True, env=ENV, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and "--runs-dir: must be a folder path of printable characters" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(p.name.startswith("runs") for p in tmp_path.iterdir())


@pytest.mark.parametrize("module", ["this", "json", "jagg_engine.grpo"])
def test_a_plugin_that_registers_nothing_is_refused(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``this`` is imported for the first time (and prints the Zen of Python), ``json`` is already imported;
    neither registers an SDE kind, backbone or reward."""
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"plugins=[{module}]"], check_environment=False)
    assert str(info.value) == (
        f"plugins: {module!r} registers nothing (no SDE kind, backbone or reward); a plugin module calls"
        " register_sde, register_backbone or register_reward"
    )


def test_a_module_that_registers_is_still_a_plugin_when_already_imported() -> None:
    """jagg_engine.rewards.simple is imported by the registry; it defines registered rewards, so it passes."""
    cfg = load_config(None, ["plugins=[jagg_engine.rewards.simple]"], check_environment=False)
    assert cfg.plugins == ["jagg_engine.rewards.simple"]


def test_jagg_runs_into_head_has_no_traceback(tmp_path: Path) -> None:
    from jagg_engine.store import open_store

    runs = tmp_path / "runs"
    with open_store(runs) as store:
        for i in range(400):  # more than a pipe's buffer of table lines
            store.create_run(f"run {i}", TrainConfig().to_dict(), None)
    proc = subprocess.run(
        f"{sys.executable} -m jagg_engine.cli runs --runs-dir {runs} | head -1",
        shell=True, capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    assert proc.stdout.startswith("id ") and proc.stdout.count("\n") == 1
    assert proc.stderr == "", proc.stderr

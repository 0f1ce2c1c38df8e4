"""Imports only go down: nothing under jagg_engine/ imports the app (read from every module's import
statements, at any depth, and from every name passed to importlib), the `jagg` command table names engine
modules only, and no engine module grows past the size one reader can hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jagg_engine import cli

ENGINE = Path(__file__).resolve().parents[1] / "jagg_engine"
MAX_LINES = 700


def engine_modules() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``: import statements anywhere in it (inside functions too),
    relative ones resolved, and string constants given to ``import_module`` / ``find_spec`` / ``__import__``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(ENGINE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "find_spec", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((node.lineno, arg.value))
    return found


def test_the_import_reader_sees_absolute_relative_nested_and_dynamic_imports(tmp_path, monkeypatch):
    package = tmp_path / "jagg_engine" / "sub"
    package.mkdir(parents=True)
    probe = package / "probe.py"
    probe.write_text(
        "import app.ui\nfrom app import data\n\n\ndef f():\n    from ..store import open_store\n"
        "    import importlib\n    importlib.import_module('app.report')\n"
    )
    monkeypatch.setattr(__import__(__name__), "ENGINE", tmp_path / "jagg_engine")
    assert [m for _, m in imported(probe)] == [
        "app.ui",
        "app",
        "jagg_engine.store",
        "importlib",
        "app.report",
    ]


def test_no_engine_module_imports_the_app():
    offenders = [
        f"{path.relative_to(ENGINE.parent)}:{line}: {module}"
        for path in engine_modules()
        for line, module in imported(path)
        if module == "app" or module.startswith("app.")
    ]
    assert offenders == []


def test_the_command_table_names_engine_modules_that_have_its_functions():
    import importlib

    assert cli.MODULE_COMMANDS
    for name, (_help, module, add, run) in cli.MODULE_COMMANDS.items():
        assert module.startswith("jagg_engine."), (name, module)
        loaded = importlib.import_module(module)
        assert callable(getattr(loaded, add)) and callable(getattr(loaded, run)), name


@pytest.mark.parametrize("path", engine_modules(), ids=lambda p: str(p.relative_to(ENGINE)))
def test_no_engine_module_is_over_700_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ENGINE.parent)}: {lines} lines; split it by concern"

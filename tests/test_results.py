"""The results written from reports/ (scripts/results.py, `make results`): every generated block of the README,
the docs pages and reports/README.md is what the committed reports give, and a stale one is rewritten."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def results_module():
    spec = importlib.util.spec_from_file_location("results", REPO / "scripts" / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_block_matches_the_committed_reports():
    done = subprocess.run(
        [sys.executable, "scripts/results.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"run `make results` and commit: {done.stdout}"


def test_a_typed_table_inside_a_block_is_replaced_by_the_race_json_figures():
    results = results_module()
    page = "before\n<!-- results: race early-window-shipped -->\n| variant | 1 s |\n<!-- end results -->\nafter\n"
    new, changed = results.update(page)
    assert changed == ["race early-window-shipped"]
    assert new.startswith("before\n<!-- results: race early-window-shipped -->\n") and new.endswith(
        "<!-- end results -->\nafter\n"
    )
    assert "| f-early-jagg | 299 s | 0.28× | 257 s – 365 s (3/3) | 1.1899 [1.1773 – 1.2106] | 70 |" in new
    assert results.update(new) == (new, [])  # written once, it stays


def test_every_race_and_report_folder_is_in_the_index():
    index = (REPO / "reports" / "README.md").read_text(encoding="utf-8")
    for folder in sorted((REPO / "reports" / "race").iterdir()):
        assert f"[race/{folder.name}](race/{folder.name}/race.md)" in index, folder.name
    for folder in sorted(p for p in (REPO / "reports").iterdir() if p.is_dir() and p.name != "race"):
        assert f"[{folder.name}]({folder.name})" in index, folder.name

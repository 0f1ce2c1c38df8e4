"""mkdocs hooks of the docs site (mkdocs.yml): the figures under reports/ are served beside the pages, so a
page links ``reports/app/x.png`` as the README does, and the site shows the committed files themselves."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("*.png", "*.svg")


def on_files(files: Files, config) -> Files:
    for pattern in FIGURES:
        for path in sorted((ROOT / "reports").rglob(pattern)):
            files.append(
                File(
                    path.relative_to(ROOT).as_posix(),
                    src_dir=str(ROOT),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files

"""Serve the JAGG Studio app: ``python launch.py [--host H] [--port P] [--auth user:pass] [--share] [--runs-dir D]``.

Runs are subprocesses in their own process groups, recorded in <runs-dir>/jagg.db: they keep training when the
browser or this server goes away, and a restarted server shows them again.

This is also a Hugging Face Space's app_file: the Space installs requirements.txt (not this project), so the
project's own packages are imported from this file's folder, and the trainer subprocesses get it on their
PYTHONPATH. On a Space (SPACE_ID set) the host is 0.0.0.0 and the runs folder is /data/jagg-runs when the
Space has persistent storage.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent

# Before gradio is imported: no usage analytics, no hub look-ups.
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="launch.py", description="Serve the JAGG Studio app.")
    # A Space sets SPACE_ID and GRADIO_SERVER_NAME=0.0.0.0; everywhere else the default is this machine only.
    default_host = os.environ.get("GRADIO_SERVER_NAME") or (
        "0.0.0.0" if os.environ.get("SPACE_ID") else "127.0.0.1"
    )
    p.add_argument("--host", default=default_host, help=f"address to bind (default {default_host})")
    p.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)),
        help="port (default 7860)",
    )
    p.add_argument("--auth", default=None, metavar="USER:PASS", help="require this login")
    p.add_argument("--share", action="store_true", help="also open a public gradio.live tunnel")
    from app.space import default_runs_dir, space_mode_from_env

    runs_dir = default_runs_dir(space_mode_from_env())
    p.add_argument(
        "--runs-dir",
        default=runs_dir,
        help=f"runs folder holding jagg.db and one folder per run (default {runs_dir})",
    )
    args = p.parse_args(argv)
    if args.auth is not None and ":" not in args.auth:
        p.error("--auth: must look like user:password")
    if not args.runs_dir or not args.runs_dir.isprintable():
        p.error(
            f"--runs-dir: must be a folder path of printable characters (no newline or tab), got {args.runs_dir[:60]!r}"
        )
    return args


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, auth: tuple[str, str] | None, share: bool, space: bool = False) -> str | None:
    """The warning printed when the app is reachable from other machines without a login (a Space is public
    by design and runs in space mode: tiny-shapes only, capped steps, no paths)."""
    if auth or space or (is_loopback(host) and not share):
        return None
    where = "a public share link" if share else f"{host} (not only this machine)"
    return (
        f"WARNING: serving on {where} without --auth: anyone who can reach it can start, cancel and "
        "delete runs on this machine. Add --auth user:password."
    )


def serve(
    demo: Any,
    host: str,
    port: int,
    auth: tuple[str, str] | None = None,
    share: bool = False,
    space: bool = False,
    prevent_thread_lock: bool = False,
) -> None:
    """Queue and launch the app's Blocks the way this command does (tests serve in-process through it)."""
    # A public Space bounds gradio's own request queue too, and takes no uploads (the app has no upload field).
    demo.queue(default_concurrency_limit=4, max_size=64 if space else None)
    demo.launch(
        server_name=host,
        server_port=port,
        auth=auth,
        share=share,
        # No allowed_paths: the runs folder (jagg.db, checkpoints, logs) is never served; sample images and
        # exports reach the browser as copies in gradio's cache (app.space.FilePublisher).
        max_file_size="1kb" if space else None,
        footer_links=["api"],
        prevent_thread_lock=prevent_thread_lock,
        css=getattr(demo, "jagg_css", None),  # app.layout's page style and run-picker script
        head=getattr(demo, "jagg_head", None),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    warning = exposure_warning(args.host, auth, args.share, space=bool(os.environ.get("SPACE_ID")))
    if warning:
        print(warning, file=sys.stderr, flush=True)

    # The trainer subprocesses import jagg_engine from here too (a Space does not install the project).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)

    from app.space import space_mode_from_env
    from app.ui import build_app

    space = space_mode_from_env()
    serve(build_app(args.runs_dir, space_mode=space), args.host, args.port, auth, args.share, space)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

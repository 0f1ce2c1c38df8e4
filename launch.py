"""Serve the JAGG Studio app: ``python launch.py [--host H] [--port P] [--auth user:pass] [--share] [--runs-dir D]``.

Runs are subprocesses in their own process groups, recorded in <runs-dir>/jagg.db: they keep training when the
browser or this server goes away, and a restarted server shows them again.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

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
    p.add_argument("--runs-dir", default="runs", help="runs folder holding jagg.db and one folder per run")
    args = p.parse_args(argv)
    if args.auth is not None and ":" not in args.auth:
        p.error("--auth: must look like user:password")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    warning = exposure_warning(args.host, auth, args.share, space=bool(os.environ.get("SPACE_ID")))
    if warning:
        print(warning, file=sys.stderr, flush=True)

    from app.ui import build_app

    demo = build_app(args.runs_dir)
    demo.queue(default_concurrency_limit=4)
    demo.launch(
        server_name=args.host,
        server_port=args.port,
        auth=auth,
        share=args.share,
        allowed_paths=[str(demo.jagg_runs_dir)],
        footer_links=["api"],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The Space build, as a Hugging Face Space does it: a fresh virtual environment with only requirements.txt and
gradio==<sdk_version of README's front matter> (no install of this project), `python launch.py` from a copy
of the repository with SPACE_ID set, and a 3-step run launched through gradio_client that finishes.

The CPU wheel torch==2.13.0 is installed first (as `make` does): requirements.txt leaves torch open so that a
Space keeps the build it brings, and on this machine plain `torch` would resolve to a multi-GB CUDA build.
Measured on the shared 2-core machine (load average ~19): install 3.0 min (pip cache warm), app start 1.9 min,
the run 3.5 min; the test writes its timings to test-artifacts/space-build.txt.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from api_client import local_client

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CPU_TORCH = "torch==2.13.0"


def _sdk_version() -> str:
    front = (REPO / "README.md").read_text().split("---")[1]
    return re.search(r"^sdk_version: (\S+)$", front, re.M).group(1)


def _checkout(dest: Path) -> None:
    """The files a Space clones: the repository's (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _listening_on_all_interfaces(port: int) -> bool:
    """Whether a socket listens on 0.0.0.0:port (IPv4) or [::]:port (/proc/net/tcp{,6}, state 0A)."""
    for table, anywhere in (("/proc/net/tcp", "00000000"), ("/proc/net/tcp6", "0" * 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port and address == anywhere:
                return True
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_space_builds_from_requirements_and_trains(tmp_path):
    timings: dict[str, float] = {}
    space = tmp_path / "space"
    _checkout(space)
    assert (space / "requirements.txt").is_file() and (
        space / "assets" / "showcase" / "showcase.json"
    ).is_file()

    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    subprocess.run([*pip, CPU_TORCH], check=True, env=env)
    subprocess.run(
        [*pip, "-r", "requirements.txt", f"gradio=={_sdk_version()}"], check=True, env=env, cwd=space
    )
    timings["install"] = time.monotonic() - start
    # Nothing of this project is installed: it is imported from the checkout, as on a Space.
    shown = subprocess.run([str(python), "-m", "pip", "show", "jagg-studio"], env=env, capture_output=True)
    assert shown.returncode != 0, "the project is installed in the Space's environment"
    probe = subprocess.run(
        [str(python), "-c", "import jagg_engine"], env=env, cwd=tmp_path, capture_output=True
    )
    assert probe.returncode != 0, "jagg_engine is importable outside the checkout"

    port = _free_port()
    app_env = {
        **env,
        "SPACE_ID": "jagg/space-build-test",  # what a Space sets; the app binds 0.0.0.0 there
        "GRADIO_SERVER_PORT": str(port),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "GRADIO_TEMP_DIR": str(tmp_path / "gradio"),
    }
    app_env.pop("GRADIO_SERVER_NAME", None)
    extra = ["--runs-dir", str(tmp_path / "runs")] if Path("/data").exists() else []  # never a real /data
    log = (tmp_path / "app.log").open("wb")
    start = time.monotonic()
    proc = subprocess.Popen(
        [str(python), "launch.py", *extra], cwd=space, env=app_env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.time() + 180
        while time.time() < deadline:
            assert proc.poll() is None, (tmp_path / "app.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError(
                f"the Space app did not answer: {(tmp_path / 'app.log').read_text()[-3000:]}"
            )
        timings["app start"] = time.monotonic() - start
        assert _listening_on_all_interfaces(port), "a Space's app must bind 0.0.0.0"

        client = local_client(url, download_files=False)
        form = [
            "space-build", "tiny-shapes", "", "shapes-dense: 1", "flow-grpo", 4, 1.0, 0.0, 0, "jagg", 3, 4, 5e-5, 0, 1,
            "prompts_per_step=2\nsampling_steps=6\nsde_window_end=null\neval_num_prompts=4\neval_seeds=[0]\n"
            "eval_every=5\nsample_every=0",
        ]  # fmt: skip
        start = time.monotonic()
        message, run_id, _ = client.predict(*form, api_name="/launch_run")
        run_id = int(run_id)  # the launched-run box is text (empty before a launch, never 0)
        assert message.startswith("Run #") and "started" in message, message
        row: dict = {}
        deadline = time.time() + 600
        while time.time() < deadline:
            table = client.predict(api_name="/history")
            rows = {r[0]: dict(zip(table["headers"], r)) for r in table["data"]}
            row = rows[run_id]
            if row["status"] in ("finished", "failed", "cancelled"):
                break
            time.sleep(2)
        timings["3-step run"] = time.monotonic() - start
        runs_dir = Path(extra[1]) if extra else space / "runs"
        stdout = (runs_dir / f"run-{run_id:04d}" / "stdout.log").read_text()[-3000:]
        assert row["status"] == "finished" and row["step"] == "3/3", f"{row}\n{stdout}"
        assert sum(1 for r in rows.values() if r["name"].startswith("showcase-")) == 2
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "space-build.txt").write_text(
            "".join(f"{what}: {seconds:.0f} s\n" for what, seconds in timings.items())
        )
        print(timings)

"""Test-wide settings: no hub, no telemetry, no analytics, temp folders for gradio."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("GRADIO_TEMP_DIR", tempfile.mkdtemp(prefix="jagg-gradio-"))

import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from faults import mount  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest-xdist workers on a 2-core machine: one intra-op thread each, so that the two
    # workers' OpenMP threads do not spin against each other (subprocesses the tests start keep their own)
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for the module's tests: the CPU is shared, and two spinning OpenMP threads on two
    busy cores crawl. Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def mounts():
    """``mounts(*mount_args)``: :func:`faults.mount` (a small tmpfs, a bind mount), each unmounted after the test."""
    made: list[Path] = []

    def add(*args: str) -> Path:
        made.append(mount(*args))
        return made[-1]

    yield add
    for path in reversed(made):
        subprocess.run(["umount", "-l", str(path)], check=False)

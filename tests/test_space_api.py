"""Space mode through the public API, as anonymous visitors (one gradio_client each, so one session each)
and the owner who logged in would call it: caps, overrides, other visitors' runs, the file route, the queue
limits and pruning; then the hardening: an alias bomb in the overrides box, owner-password guessing, the
temp folder under 50 report requests, every endpoint fuzzed with wrong types, and a Markdown/HTML run name
in a real Chromium.

The app is served in-process by launch.serve (the options of `python launch.py` on a Space) over a fresh
runs folder holding the shipped showcase. A stand-in trainer keeps the trainer's contract (status, metrics,
an eval image, a log and a checkpoint file, stop when asked) in a fraction of a second a step, so that
what is tested is the app's policy, not training.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from api_client import local_client

import launch
from app import ui
from app.form import form_name
from app.space import CAPS, MIN_EVERY, SpaceLimits, folder_size

pytestmark = (
    pytest.mark.slow
)  # ~3 min on the shared 2-core CPU (in-process apps, ~600 API calls, one Chromium)

PASSWORD = "correct horse battery staple"
FAKE_TRAINER = textwrap.dedent(
    """
    import argparse, os, sys, time
    from pathlib import Path
    from PIL import Image
    from jagg_engine.store import open_store

    p = argparse.ArgumentParser()
    p.add_argument("--run-id", type=int)
    p.add_argument("--resume", type=int)
    p.add_argument("--runs-dir")
    a = p.parse_args()
    run_id = a.run_id or a.resume
    store = open_store(a.runs_dir)
    run = store.get_run(run_id)
    run_dir = Path(run["run_dir"])
    store.set_status(run_id, "running", pid=os.getpid())
    (run_dir / "train.log").write_text("step 1 reward 1.0\\n")
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    (run_dir / "checkpoints" / "step_00001.pt").write_bytes(b"w" * CKPT_BYTES)
    image = run_dir / "samples" / "eval" / "step_00000" / "000_seed0.png"
    image.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (200, 10, 10)).save(image)
    sample = {"kind": "eval", "prompt": "red circle left", "seed": 0, "reward": 1.0,
              "path": "samples/eval/step_00000/000_seed0.png"}
    store.log_samples(run_id, 0, [sample])
    for step in range(1, run["config"]["steps"] + 1):
        if store.cancel_requested(run_id):
            store.set_status(run_id, "cancelled")
            sys.exit(0)
        store.log_step(run_id, step, {"reward/mean": 1.0, "time/update": 0.1})
        time.sleep(STEP_S)
    store.set_status(run_id, "finished")
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SpaceApp:
    """build_app in space mode with the stand-in trainer, served by launch.serve on a free port."""

    def __init__(self, tmp: Path, limits: SpaceLimits, step_s: float = 0.1, ckpt_bytes: int = 1000):
        tmp.mkdir(parents=True, exist_ok=True)
        script = tmp / "fake_trainer.py"
        script.write_text(f"CKPT_BYTES = {ckpt_bytes}\nSTEP_S = {step_s}\n" + FAKE_TRAINER)

        def command(run_id: int, runs_dir: Path, flag: str = "--run-id") -> list[str]:
            return [sys.executable, str(script), flag, str(run_id), "--runs-dir", str(runs_dir)]

        self.runs = tmp / "runs"
        self.demo = ui.build_app(
            self.runs,
            space_mode=True,
            command=command,
            resume_command=lambda run_id, runs_dir: command(run_id, runs_dir, "--resume"),
            cancel_timeout=10.0,
            owner_password=PASSWORD,
            limits=limits,
        )
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        launch.serve(self.demo, "127.0.0.1", self.port, space=True, prevent_thread_lock=True)
        self.showcase = self.demo.jagg_showcase_ids
        self.tmp = tmp

    def client(self, download: bool = False):
        return local_client(self.url, download_files=str(self.tmp / "dl") if download else False)

    def owner(self):
        client = self.client(download=True)
        assert client.predict(PASSWORD, api_name="/owner_login") == "Logged in as the owner for this session."
        return client

    def close(self) -> None:
        self.demo.jagg_stop_ticker.set()
        self.demo.close()
        manager = self.demo.jagg_manager
        for run in manager.store.list_runs():
            if run["status"] in ("queued", "running") and run["pid"]:
                manager.kill(run["id"])
        manager.shutdown()


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    served = SpaceApp(tmp_path_factory.mktemp("space-api"), SpaceLimits(per_visitor=2, total=3), step_s=0.5)
    yield served
    served.close()


def form(**changes) -> list:
    values = {
        "name": "visitor",
        "backbone": "tiny-shapes",
        "model_path": "",
        "rewards": "shapes-dense: 1",
        "algorithm": "flow-grpo",
        "window": 4,
        "jagg_frac": 1.0,
        "cv_frac": 0.0,
        "jagg_until_step": 0,
        "strategy": "jagg",
        "steps": 2,
        "group_size": 4,
        "lr": 5e-5,
        "seed": 0,
        "processes": 1,
        "overrides": "prompts_per_step=2\nsampling_steps=6\nsde_window_end=null\neval_num_prompts=4",
    }
    values.update(changes)
    return list(values.values())


def history(client) -> dict[int, dict]:
    table = client.predict(api_name="/history")
    return {row[0]: dict(zip(table["headers"], row)) for row in table["data"]}


def wait_status(client, run_id: int, statuses: tuple[str, ...], timeout: float = 60) -> str:
    deadline = time.time() + timeout
    status = None
    while time.time() < deadline:
        status = history(client).get(run_id, {}).get("status")
        if status in statuses:
            return status
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} is {status}, not {statuses} after {timeout} s")


def launched_id(message: str) -> int:
    assert message.startswith("Run #"), message
    return int(message.split("#")[1].split()[0])


def one_line_refusal(message: str, prefix: str) -> str:
    assert message.startswith(prefix) and "\n" not in message, message
    return message[len(prefix) :].strip()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# One over-cap value for each capped field, through the form field where there is one, else an override.
OVER_CAP = [
    ("steps", {"steps": CAPS["steps"] + 1}),
    ("group_size", {"group_size": 1_000_000}),
    ("processes", {"processes": 2}),
    ("prompts_per_step", {"overrides": "prompts_per_step=1000000"}),
    ("sampling_steps", {"overrides": "sampling_steps=1000000"}),
    ("eval_num_prompts", {"overrides": f"eval_num_prompts={CAPS['eval_num_prompts'] + 1}"}),
    ("eval_seeds", {"overrides": f"eval_seeds=[{', '.join(str(i) for i in range(1000))}]"}),
    ("lora_rank", {"overrides": f"lora_rank={CAPS['lora_rank'] + 1}"}),
    *[(key, {"overrides": f"{key}=1"}) for key in MIN_EVERY],
    ("rewards", {"rewards": "pickscore: 1"}),
    ("backbone", {"overrides": "backbone=tiny-flux"}),
    ("model_path", {"model_path": "/etc"}),
    ("prompts_file", {"overrides": "prompts_file=/etc/passwd.txt"}),
    ("output_dir", {"overrides": "output_dir=/tmp"}),
    ("backbone_options", {"overrides": "backbone_options={weights: /etc}"}),
    ("precision", {"overrides": "precision=bf16"}),
]


@pytest.mark.parametrize(("field", "changes"), OVER_CAP, ids=[f for f, _ in OVER_CAP])
def test_visitor_over_cap_and_overrides_are_refused(app, field, changes):
    client = app.client()
    before = set(history(client))
    for endpoint in ("/launch_run", "/compare_exact_jagg"):
        message, run_id, _ = client.predict(*form(**changes), api_name=endpoint)
        reason = one_line_refusal(message, "**Not launched.**")
        assert reason.startswith(f"{form_name(field)}: this Space "), reason  # the form's name of it
        assert run_id is None
    assert set(history(client)) == before, "a refused launch created a run"


def test_the_owner_may_exceed_the_caps(app):
    owner = app.owner()
    prompts = app.tmp / "prompts.txt"
    prompts.write_text("red circle left\n")
    over = "\n".join(
        [f"prompts_per_step={CAPS['prompts_per_step'] + 1}", f"sampling_steps={CAPS['sampling_steps'] + 1}",
         "eval_every=1", "eval_seeds=[0, 1, 2]", f"prompts_file={prompts}", "backbone=tiny-flux",
         "rewards={brightness: 1}", "eval_num_prompts=1"]
    )  # fmt: skip
    message, run_id, _ = owner.predict(
        *form(steps=CAPS["steps"] + 1, group_size=CAPS["group_size"] + 1, overrides=over),
        api_name="/launch_run",
    )
    run_id = launched_id(message)
    assert "stop requested" in owner.predict(run_id, api_name="/cancel_run") or "cancelled" in owner.predict(
        run_id, api_name="/cancel_run"
    )
    assert wait_status(owner, run_id, ("cancelled",)) == "cancelled"


def test_visitors_act_only_on_their_own_runs(app):
    alice, bob = app.client(), app.client()
    run_id = launched_id(alice.predict(*form(steps=CAPS["steps"]), api_name="/launch_run")[0])
    wait_status(alice, run_id, ("running",))

    for who in (bob, app.client()):  # another visitor, and Alice herself after a page reload
        reason = one_line_refusal(who.predict(run_id, api_name="/cancel_run"), "**Refused.**")
        assert reason == (
            f"cancel: run {run_id} was not started in this session; only the owner (logged in) can cancel it"
        )
    assert "stop requested" in alice.predict(run_id, api_name="/cancel_run")
    assert wait_status(alice, run_id, ("cancelled",)) == "cancelled"

    message = one_line_refusal(bob.predict(run_id, api_name="/resume_run"), "**Refused.**")
    assert message.startswith(f"resume: run {run_id} was not started in this session")
    message, _ = bob.predict(run_id, True, api_name="/delete_run")
    assert one_line_refusal(message, "**Refused.**").startswith(f"delete: run {run_id} was not started")
    assert history(bob)[run_id]["status"] == "cancelled" and (app.runs / f"run-{run_id:04d}").is_dir()

    assert "resuming from its last checkpoint" in alice.predict(run_id, api_name="/resume_run")
    assert wait_status(alice, run_id, ("running",)) == "running"

    # The owner, logged in, may cancel, resume and delete Alice's run.
    owner = app.owner()
    assert "stop requested" in owner.predict(run_id, api_name="/cancel_run")
    wait_status(owner, run_id, ("cancelled",))
    assert "resuming from its last checkpoint" in owner.predict(run_id, api_name="/resume_run")
    wait_status(owner, run_id, ("running",))
    owner.predict(run_id, api_name="/cancel_run")
    wait_status(owner, run_id, ("cancelled",))
    message, _ = owner.predict(run_id, True, api_name="/delete_run")
    assert message == f"Run #{run_id} deleted with its folder."
    assert run_id not in history(owner) and not (app.runs / f"run-{run_id:04d}").exists()

    # The showcase is read-only for everyone, the owner included.
    for who in (bob, owner):
        for endpoint, args in (("/delete_run", (app.showcase[0], True)), ("/resume_run", (app.showcase[1],))):
            answer = who.predict(*args, api_name=endpoint)
            message = answer[0] if isinstance(answer, (list, tuple)) else answer
            assert "is the shipped showcase, which is read-only" in one_line_refusal(message, "**Refused.**")
    assert set(app.showcase) <= set(history(bob))


def test_file_route_serves_sample_images_and_own_exports_only(app):
    alice = app.client()
    run_id = launched_id(alice.predict(*form(steps=1), api_name="/launch_run")[0])
    wait_status(alice, run_id, ("finished",))
    run_dir = app.runs / f"run-{run_id:04d}"

    gallery, _ = alice.predict(run_id, "eval", 0, api_name="/step_images")  # the step slider's images
    image_url = gallery[0]["image"]["url"]
    status, body = get(image_url)
    assert status == 200 and body.startswith(b"\x89PNG")
    message, files = alice.predict(run_id, api_name="/export_run")
    assert message == f"Exported run #{run_id}."
    for item in files:
        status, body = get(item["url"])
        assert status == 200 and body, item
    assert not (app.runs / "exports").exists(), "a visitor's export was written into the runs folder"

    secrets = {
        "database": app.runs / "jagg.db",
        "checkpoint": run_dir / "checkpoints" / "step_00001.pt",
        "log": run_dir / "train.log",
        "ownership": app.runs / "space-runs.json",
        "image not shown": run_dir / "samples" / "eval" / "step_00000" / "000_seed0.png",
    }
    for what, path in secrets.items():
        assert path.is_file(), what
        status, body = get(f"{app.url}gradio_api/file={path}")
        assert status == 403, (what, status)
        detail = json.loads(body)["detail"]
        assert detail == f"File not allowed: {path}." and "\n" not in detail, detail

    # The owner downloads the same files through the owner endpoint; a visitor is refused there.
    message, file = alice.predict("jagg.db", api_name="/owner_file")
    assert one_line_refusal(message, "**Refused.**") == "download: only the owner (logged in) can do this"
    assert file is None
    owner = app.owner()
    message, db = owner.predict("jagg.db", api_name="/owner_file")
    with sqlite3.connect(db) as conn:
        assert run_id in {row[0] for row in conn.execute("SELECT id FROM runs")}
    for rel in (f"run-{run_id:04d}/checkpoints/step_00001.pt", f"run-{run_id:04d}/train.log"):
        message, path = owner.predict(rel, api_name="/owner_file")
        assert Path(path).read_bytes() == (app.runs / rel).read_bytes(), message
    message, path = owner.predict("../../etc/passwd", api_name="/owner_file")
    assert path is None and "no file '../../etc/passwd' in the runs folder" in message


def test_queue_limits_per_visitor_and_in_total(app):
    carol, dave, erin = app.client(), app.client(), app.client()
    message, jagg_id, _ = carol.predict(*form(steps=CAPS["steps"]), api_name="/compare_exact_jagg")
    jagg_id = int(jagg_id)  # the launched-run box is text (empty before a launch, never 0)
    side = app.demo.jagg_manager.pair_plan({"processes": 1}).mode == "side-by-side"  # this machine's mode
    assert message.startswith("Pair side by side: exact" if side else "Pair one after the other: exact"), (
        message
    )
    reason = one_line_refusal(carol.predict(*form(), api_name="/launch_run")[0], "**Not launched.**")
    assert reason == (
        "queue: you have 2 run(s) waiting or training and this Space allows 2 per visitor; wait for one to "
        "finish or cancel it"
    )
    dave_run = launched_id(dave.predict(*form(steps=CAPS["steps"]), api_name="/launch_run")[0])
    reason = one_line_refusal(erin.predict(*form(), api_name="/launch_run")[0], "**Not launched.**")
    assert reason == (
        "queue: this Space's queue is full (3 run(s) waiting or training, at most 3); try again when one finishes"
    )
    # Cancelling frees the places.
    for client, run_id in ((carol, jagg_id - 1), (carol, jagg_id), (dave, dave_run)):
        client.predict(run_id, api_name="/cancel_run")
    for run_id in (jagg_id - 1, jagg_id, dave_run):
        wait_status(erin, run_id, ("cancelled",))
    assert launched_id(erin.predict(*form(steps=1), api_name="/launch_run")[0])


def test_the_oldest_visitor_runs_are_pruned_past_the_size_limit(tmp_path):
    probe = SpaceApp(tmp_path / "probe", SpaceLimits())  # the size of a fresh folder with the showcase
    probe.close()
    base = folder_size(probe.runs)
    # Checkpoints large against the history's WAL file (up to ~4 MB before SQLite checkpoints it), which the
    # folder size also counts: the pruning below then depends on the runs, not on when the WAL was reset.
    ckpt = 10_000_000
    served = SpaceApp(
        tmp_path / "app",
        SpaceLimits(per_visitor=9, total=9, max_runs_bytes=base + int(2.5 * ckpt), prune_every_s=0),
        ckpt_bytes=ckpt,
    )
    try:
        visitor, owner = served.client(), served.owner()
        owner_run = launched_id(owner.predict(*form(steps=1, name="owner"), api_name="/launch_run")[0])
        wait_status(owner, owner_run, ("finished",))
        runs = []
        for i in range(3):  # each finished run holds a 10 MB checkpoint
            runs.append(launched_id(visitor.predict(*form(steps=1, name=f"v{i}"), api_name="/launch_run")[0]))
            wait_status(visitor, runs[-1], ("finished", None))  # None: already pruned
        # Past 2.5 checkpoints the queue's tick prunes the oldest finished visitor runs until the folder fits:
        # the owner's run, the newest visitor run and the showcase stay.
        expected = {owner_run, runs[2], *served.showcase}
        deadline = time.time() + 60
        while set(history(visitor)) != expected and time.time() < deadline:
            time.sleep(0.5)
        assert set(history(visitor)) == expected
        assert (
            not (served.runs / f"run-{runs[0]:04d}").exists()
            and (served.runs / f"run-{runs[2]:04d}").is_dir()
        )
    finally:
        served.close()


# ---------------------------------------------------------------------------------------------- hardening


def _bomb_line(depth: int = 8) -> str:
    """A depth-8 YAML alias bomb as one flow mapping (9^9 strings once expanded), one line of the box."""
    items = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    items += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth + 1)]
    return "{" + ", ".join(items) + "}"


def test_an_alias_bomb_in_the_overrides_box_is_refused_before_it_expands(app):
    """Through the API, as a visitor: the refusal, and the app (in this process) grows by at most 50 MB of peak
    RSS (the bomb expanded would take gigabytes)."""
    import resource

    client = app.client()
    for box in (f"rewards={_bomb_line()}", f"reward_options={_bomb_line()}", f"eval_seeds={'[' * 1000}"):
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        message, run_id, _ = client.predict(*form(overrides=box), api_name="/launch_run")
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
        assert run_id is None and message.startswith("**Not launched.** ") and "\n" not in message, message
        assert "anchors and aliases are not allowed" in message or "nesting deeper than 16" in message, (
            message
        )
        assert grown <= 50 * 1024**2, grown
        assert len(message) < 300


def test_fifty_wrong_owner_guesses_from_ten_sessions_then_the_owner_gets_in(app):
    """10 gradio_client sessions from one address guess 5 times each (X-Forwarded-For is the address the
    Space's proxy saw); then the owner, from its own address, logs in at once."""
    replies = []
    for _ in range(10):
        guesser = local_client(app.url, download_files=False, headers={"X-Forwarded-For": "203.0.113.7"})
        replies += [guesser.predict(f"guess {i}", api_name="/owner_login") for i in range(5)]
    assert len(replies) == 50 and replies.count("Wrong password.") == 10, replies
    assert all(r.startswith("Too many wrong passwords from this address") for r in replies[10:])
    owner = local_client(app.url, download_files=False, headers={"X-Forwarded-For": "198.51.100.2"})
    assert owner.predict(PASSWORD, api_name="/owner_login") == "Logged in as the owner for this session."


@pytest.fixture
def cache_app(tmp_path, monkeypatch):
    """A Space app whose gradio cache (GRADIO_TEMP_DIR) is a folder of the test."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio-cache"))
    served = SpaceApp(tmp_path / "app", SpaceLimits(per_visitor=2, total=3))
    yield served
    served.close()


def test_fifty_report_requests_leave_the_temp_folder_within_its_bound(cache_app, monkeypatch):
    """50 report requests (10 visitors × 5: reports of runs #1, #2, #1+#2, #2+#1, #1 again; ≈1.3 MB each, the
    showcase's images inlined) through the API: without pruning, ≈ 53 MB of distinct reports. The visitors'
    reports live in gradio's cache (no second copy), each session keeps its newest EXPORTS_PER_SESSION, and
    the folder of all stays within EXPORTS_MAX_BYTES plus the report just written. The bound is lowered to
    16 MB here (the app reads it at each prune), so that these 50 reports pass it twice over and the pruning
    across sessions is what holds it."""
    from app import space

    monkeypatch.setattr(space, "EXPORTS_MAX_BYTES", 16 * 1024**2)

    cache = Path(os.environ["GRADIO_TEMP_DIR"])
    picks = [[1], [2], [1, 2], [2, 1], [1]]
    replies, size = [], 0
    for _ in range(10):
        client = local_client(cache_app.url, download_files=False)
        for pick in picks:
            message, path = client.predict(pick, 1.8, api_name="/report_runs")
            replies.append(message)
            path = Path(path["path"] if isinstance(path, dict) else path)  # the server's file (no download)
            assert path.is_relative_to(cache / "jagg-exports") and path.is_file(), path
            size = max(size, path.stat().st_size)
    assert sum(r.startswith("Report of runs") for r in replies) == 50, replies
    assert 40 * size > 2 * space.EXPORTS_MAX_BYTES  # the distinct reports would pass the bound twice over
    bound = space.EXPORTS_MAX_BYTES + size
    assert folder_size(cache / "jagg-exports") <= bound, (folder_size(cache / "jagg-exports"), bound)
    assert folder_size(cache) <= bound + 1024**2  # nothing else of the reports is cached
    assert all(
        len(list(d.iterdir())) <= space.EXPORTS_PER_SESSION for d in (cache / "jagg-exports").iterdir()
    )


FUZZ = [None, "", -1, 1e308, [1, 2], {"a": 1}, "x" * 1_000_000]


def test_every_endpoint_answers_wrong_types_with_a_readable_line_and_stays_up(tmp_path):
    """Every API endpoint, each parameter in turn given None, "", -1, 1e308, a list, a dict and a 1 MB
    string (the others at their defaults): a reply, or an error of one readable line naming the input
    (never gradio's bare "upstream app raised an exception"), and the app answers afterwards."""
    from gradio_client.exceptions import AppError

    served = SpaceApp(tmp_path, SpaceLimits(per_visitor=2, total=3))
    try:
        client = served.client()
        endpoints = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
        assert len(endpoints) >= 15, list(endpoints)
        calls = 0
        for name, endpoint in endpoints.items():
            params = endpoint["parameters"]
            defaults = [p["parameter_default"] if p.get("parameter_has_default") else None for p in params]
            for i, param in enumerate(params):
                for bad in FUZZ:
                    args = list(defaults)
                    args[i] = bad
                    calls += 1
                    try:
                        out = client.predict(*args, api_name=name)
                    except AppError as exc:
                        text = str(exc)
                        where = (name, param["parameter_name"], repr(bad)[:30], text[:200])
                        assert "\n" not in text and len(text) <= 300, where
                        assert "upstream" not in text.lower() and "Traceback" not in text, where
                        continue
                    texts = [
                        o for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, str)
                    ]
                    assert all(len(t) < 5000 for t in texts), (name, param["parameter_name"], repr(bad)[:30])
        assert calls >= 300
        assert history(client)  # still up
    finally:
        served.close()


def test_a_run_name_with_markdown_or_html_renders_as_text_in_chromium(tmp_path):
    """A visitor names a run with an image, a link and an <img> tag pointing at a local port nobody
    listens on; another visitor's browser shows the name as typed, makes no request to that port, and shows
    no image or link of it (Live progress line and History table)."""
    from browser import chromium
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # The trap port stays bound (not listening: a request to it is refused) so that no server of this machine,
    # the app's own included, can be given it while the test runs.
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    trap = holder.getsockname()[1]
    name = f"![a](//127.1:{trap}/a)<img src=//127.1:{trap}/b>[Owner login](/x)"  # 127.1 = 127.0.0.1
    assert len(name) <= 64
    served = SpaceApp(tmp_path, SpaceLimits(per_visitor=2, total=3), step_s=5.0)
    assert urllib.parse.urlparse(served.url).port != trap
    driver = chromium("1300,1100", logs=True)
    try:
        message, run_id, _ = served.client().predict(*form(name=name, steps=30), api_name="/launch_run")
        assert run_id, message
        driver.get(served.url)
        WebDriverWait(driver, 60).until(
            lambda d: d.find_elements(By.XPATH, "//button[@role='tab' and normalize-space()='Live']")
        )
        driver.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='Live']").click()
        progress = WebDriverWait(driver, 60, poll_frequency=0.3).until(
            lambda d: (
                (el := d.find_element(By.ID, "live-progress")) and f"Run #{int(run_id)}" in el.text and el
            )
        )
        assert name in progress.text, progress.text
        assert not progress.find_elements(By.TAG_NAME, "img") and not progress.find_elements(By.TAG_NAME, "a")
        driver.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='History']").click()
        WebDriverWait(driver, 30, poll_frequency=0.3).until(
            lambda d: name in d.find_element(By.TAG_NAME, "body").text
        )
        time.sleep(1.0)
        page_images = driver.execute_script("return [...document.images].map(i => i.src)")
        assert not [src for src in page_images if f":{trap}/" in src], page_images
        links = driver.execute_script("return [...document.links].map(a => a.textContent)")
        assert "Owner login" not in links, links
        urls = [
            json.loads(entry["message"])["message"]["params"]["request"]["url"]
            for entry in driver.get_log("performance")
            if json.loads(entry["message"])["message"]["method"] == "Network.requestWillBeSent"
        ]
        assert not [u for u in urls if f":{trap}" in u], urls
    finally:
        driver.quit()
        served.close()
        holder.close()

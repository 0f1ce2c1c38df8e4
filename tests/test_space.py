"""app/space.py's pure parts: the caps on a visitor's config, limits from the environment, the runs folder on a
Space, publishing files, pruning; and requirements.txt against pyproject.toml. The same rules are exercised
through the public API, as a visitor calls them, in tests/test_space_api.py."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path

import pytest

from app import space
from app.space import CAPS, MIN_EVERY, SpaceGuard, SpaceLimits, check_space_config, folder_size
from jagg_engine.store import open_store
from jagg_engine.train.config import ConfigError, TrainConfig

REPO = Path(__file__).resolve().parents[1]


def test_the_shipped_setting_passes_and_every_field_is_classified():
    # The shipped tiny-shapes config, cut to the Space's step cap, is what a visitor's form starts from.
    check_space_config(dataclasses.replace(TrainConfig(), steps=CAPS["steps"]))
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    named = {"backbone", "rewards", *space.PATH_FIELDS, *CAPS, *MIN_EVERY, *space.TUNABLE}
    assert named <= fields, f"space.py names fields the config lacks: {named - fields}"


@pytest.mark.parametrize("key", sorted(CAPS))
def test_each_cap_refuses_one_over(key):
    cap = CAPS[key]
    value = list(range(cap + 1)) if key == "eval_seeds" else cap + 1
    cfg = dataclasses.replace(TrainConfig(), **{"steps": CAPS["steps"], key: value})
    with pytest.raises(ConfigError) as err:
        check_space_config(cfg)
    message = str(err.value)
    assert message.startswith(f"{key}: this Space allows at most {cap}") and "\n" not in message
    at_cap = list(range(cap)) if key == "eval_seeds" else cap
    check_space_config(dataclasses.replace(TrainConfig(), **{"steps": CAPS["steps"], key: at_cap}))


@pytest.mark.parametrize("key", sorted(MIN_EVERY))
def test_periodic_work_is_never_or_far_apart(key):
    shipped = dataclasses.replace(TrainConfig(), steps=CAPS["steps"])
    with pytest.raises(
        ConfigError, match=rf"^{key}: this Space allows 0 \(never\) or at least {MIN_EVERY[key]}"
    ):
        check_space_config(dataclasses.replace(shipped, **{key: 1}))
    check_space_config(dataclasses.replace(shipped, **{key: 0}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backbone": "tiny-flux"}, "backbone: this Space offers only tiny-shapes, got 'tiny-flux'"),
        ({"model_path": "/etc"}, "model_path: this Space accepts no file or folder paths"),
        ({"output_dir": "/tmp/elsewhere"}, "output_dir: this Space accepts no file or folder paths"),
        ({"reward_options": {"shapes": {"x": 1}}}, "reward_options: this Space accepts no file"),
        ({"rewards": {"pickscore": 1.0}}, "rewards: this Space offers only the weight-free rewards"),
        ({"rewards": {n: 1.0 for n in space.SPACE_REWARDS[:5]}}, "rewards: this Space allows at most 4"),
        ({"name": "x" * 65}, "name: this Space allows at most 64 characters, got 65"),
        ({"precision": "bf16"}, "precision: this Space keeps the shipped value 'fp32', got 'bf16'"),
        ({"gradient_checkpointing": True}, "gradient_checkpointing: this Space keeps the shipped value"),
    ],
)
def test_fixed_fields_keep_the_shipped_value(changes, message):
    with pytest.raises(ConfigError) as err:
        check_space_config(dataclasses.replace(TrainConfig(), **{"steps": CAPS["steps"], **changes}))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_tunable_fields_stay_free():
    check_space_config(
        dataclasses.replace(
            TrainConfig(), name="mine", seed=3, strategy="exact", window=2, jagg_frac=0.5, lr=1e-4, steps=3,
            sampling_steps=6, sde_window_end=None, group_size=2, prompts_per_step=2, eval_num_prompts=4,
            eval_seeds=[5], rewards={"brightness": 1.0, "shapes": 0.5},
        )
    )  # fmt: skip


def test_limits_from_the_environment():
    assert SpaceLimits.from_env({}) == SpaceLimits()
    got = SpaceLimits.from_env(
        {"JAGG_SPACE_QUEUE_PER_VISITOR": "1", "JAGG_SPACE_QUEUE_TOTAL": "9", "JAGG_SPACE_MAX_RUNS_MB": "5"}
    )
    assert (got.per_visitor, got.total, got.max_runs_bytes) == (1, 9, 5 * 1024**2)
    with pytest.raises(ValueError, match=r"JAGG_SPACE_QUEUE_TOTAL: must be an integer >= 1, got 'lots'"):
        SpaceLimits.from_env({"JAGG_SPACE_QUEUE_TOTAL": "lots"})


def test_runs_folder_goes_to_persistent_storage(tmp_path):
    assert space.default_runs_dir(False, tmp_path) == "runs"
    assert space.default_runs_dir(True, tmp_path) == str(tmp_path / "jagg-runs")
    assert space.default_runs_dir(True, tmp_path / "missing") == "runs"


def test_publisher_copies_only_what_gradio_could_not_reach(tmp_path, monkeypatch):
    inside = tmp_path / "runs"
    (inside / "run-0001").mkdir(parents=True)
    image = inside / "run-0001" / "a.png"
    image.write_bytes(b"png")
    assert space.FilePublisher(inside)(image) == str(image)  # under the temp dir: gradio copies it itself
    monkeypatch.setattr(space.tempfile, "gettempdir", lambda: str(tmp_path / "elsewhere"))
    monkeypatch.chdir(tmp_path / "runs" / "run-0001")
    publisher = space.FilePublisher(inside, public_dir=tmp_path / "public")
    copy = Path(publisher(image))
    assert copy.read_bytes() == b"png" and copy.is_relative_to(tmp_path / "public") and copy.name == "a.png"
    assert publisher(image) == str(copy)  # the same file is copied once


def test_export_folder_is_named_by_a_hash_of_the_session():
    folder = space.session_export_dir("../../etc")
    assert folder.parent.name == "jagg-exports" and re.fullmatch(r"[0-9a-f]{32}", folder.name)


def test_owner_login(tmp_path):
    guard = SpaceGuard(tmp_path, space=True, owner_password="s3cret")
    assert not guard.is_owner("a")
    assert guard.login("a", "wrong") == "Wrong password."
    assert guard.login("a", "s3cret").startswith("Logged in as the owner")
    assert guard.is_owner("a") and not guard.is_owner("b") and not guard.is_owner(None)
    for _ in range(SpaceGuard.LOGIN_TRIES_PER_SESSION):
        guard.login("c", "nope")
    assert "Too many wrong passwords" in guard.login("c", "s3cret") and not guard.is_owner("c")
    assert "Owner login is off" in SpaceGuard(tmp_path, space=True).login("a", "")
    assert SpaceGuard(tmp_path, space=False).is_owner(None)  # local: whoever reaches the app


def test_prune_deletes_the_oldest_finished_visitor_runs_only(tmp_path):
    store = open_store(tmp_path)
    ids = []
    for i, (_who, status) in enumerate(
        [("v1", "finished"), ("owner", "finished"), ("v1", "failed"), ("v2", "running"), ("v2", "finished")]
    ):
        run_dir = tmp_path / f"run-{i + 1:04d}"
        run_dir.mkdir()
        (run_dir / "big.bin").write_bytes(b"x" * 100_000)
        run_id = store.create_run(f"r{i}", {}, run_dir)
        store.set_status(run_id, "running")
        if status != "running":
            store.set_status(run_id, status)
        ids.append(run_id)
    # Over the limit by 1.5 runs' worth: two runs must go.
    limit = space.folder_size(tmp_path) - 150_000
    guard = SpaceGuard(tmp_path, space=True, limits=SpaceLimits(max_runs_bytes=limit, prune_every_s=0))
    guard._owners.add("owner")
    for run_id, who in zip(ids, ["v1", "owner", "v1", "v2", "v2"]):
        guard.record(who, [run_id])
    pruned = guard.prune(store)
    # The oldest finished visitor runs go (1, then 3) until the folder fits; the owner's run (2) and the
    # running one (4) are never candidates, and 5 is not needed.
    assert pruned == [ids[0], ids[2]]
    left = {r["id"] for r in store.list_runs()}
    assert left == {ids[1], ids[3], ids[4]}
    assert not (tmp_path / "run-0001").exists() and (tmp_path / "run-0002").exists()
    store.close()


def test_requirements_match_the_package_dependencies():
    """A Space installs requirements.txt, `make` installs pyproject.toml: the same packages, less gradio (the
    Space brings its own, pinned by README's sdk_version)."""
    block = (REPO / "pyproject.toml").read_text().split("\ndependencies = [", 1)[1].split("]", 1)[0]
    deps = re.findall(r'"([^"]+)"', block)
    assert "torch>=2.4" in deps and len(deps) >= 10
    lines = [
        line.strip()
        for line in (REPO / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert sorted(lines) == sorted(d for d in deps if not d.startswith("gradio"))
    front = (REPO / "README.md").read_text().split("---")[1]
    assert re.search(r"^sdk_version: \d+\.\d+\.\d+$", front, re.M) and "app_file: launch.py" in front
    assert not (REPO / "packages.txt").exists() or (REPO / "packages.txt").read_text().strip()
    assert os.access(REPO / "launch.py", os.R_OK)


def test_fifty_wrong_guesses_from_ten_sessions_do_not_lock_the_owner_out(tmp_path):
    """The guesser is limited per session and per client address; the owner signs in with Hugging Face (the
    Space's author, SPACE_AUTHOR_NAME) or uses the password from its own address, and gets in either way."""
    guard = SpaceGuard(tmp_path, space=True, owner_password="s3cret", owner_name="Alice")
    replies = [guard.login(f"guess-{i % 10}", f"wrong-{i}", "203.0.113.7") for i in range(50)]
    assert replies[0] == "Wrong password." and replies[-1].startswith("Too many wrong passwords")
    assert not any(guard.is_owner(f"guess-{i}") for i in range(10))
    # The right password from the guesser's address is refused too (otherwise guessing would be unlimited).
    assert guard.login("guess-new", "s3cret", "203.0.113.7").startswith("Too many wrong passwords from this")
    assert not guard.is_owner("guess-new")
    # The owner: by password from its own address, and by Hugging Face sign-in (case of the name aside).
    assert guard.login("owner-1", "s3cret", "198.51.100.2") == "Logged in as the owner for this session."
    assert guard.login_oauth("owner-2", "alice").startswith(
        "Signed in with Hugging Face as the Space's author"
    )
    assert guard.is_owner("owner-1") and guard.is_owner("owner-2")
    assert guard.login_oauth("visitor", "mallory").endswith("owner rights are for the Space's author only.")
    assert not guard.is_owner("visitor")
    assert "unknown" in SpaceGuard(tmp_path, space=True).login_oauth("s", "alice")


def test_prune_exports_keeps_a_bound(tmp_path):
    root = tmp_path / "jagg-exports"
    now = time.time()
    written = []
    for i in range(30):  # 30 reports of 1 MB from 3 sessions, oldest first
        path = root / f"session-{i % 3}" / f"report-{i}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 1_000_000)
        os.utime(path, (now - 100 + i, now - 100 + i))
        written.append(path)
        space.prune_exports(root, keep=[path], per_session=4, max_bytes=6_000_000)
        assert folder_size(root) <= 6_000_000 + 1_000_000 and path.exists()
    left = sorted(p.name for p in root.rglob("*.html"))
    assert left == sorted(p.name for p in written[-6:])  # the newest, within the byte bound


def test_user_text_in_markdown_is_shown_as_typed():
    from app.text import md_code_block, md_message, md_text

    name = "![x](https://evil.example/a.png) [Owner login](https://evil.example) <img src=x onerror=alert(1)>"
    escaped = md_text(name)
    assert "<" not in escaped and not re.search(r"(?<!\\)[\[\]]", escaped) and "https://" not in escaped
    assert md_text("tiny-shapes my_run 1.5") == "tiny-shapes my_run 1.5"  # nothing to escape: unchanged
    assert re.sub(r"\\(.)", r"\1", escaped).replace("&lt;", "<").replace("&gt;", ">") == name
    message = md_message(f"name: got {name!r}")
    assert not re.search(r"(?<!\\)(<[a-z/]|\]\(|`)", message) and "https://" not in message
    assert md_message("steps: must be an integer <= 2147483647, got [1, 2]") == (
        "steps: must be an integer <= 2147483647, got [1, 2]"
    )  # a message without markup is left as it is
    assert md_code_block("a ``` b ```` c").startswith("`````\n")


def test_with_hf_oauth_the_space_offers_sign_in_and_the_author_becomes_owner(tmp_path, monkeypatch):
    """With the environment a Space with ``hf_oauth: true`` gets (OAUTH_CLIENT_ID, SPACE_AUTHOR_NAME), the
    app shows gradio's LoginButton and, on page load, gives owner rights to the session signed in as the
    author. gradio fills the OAuthProfile from the signed-in session; Hugging Face's OAuth cannot run
    offline, so the profile is made here, and gradio's OAuth routes (which need gradio[oauth]) are not
    attached."""
    import types

    import gradio as gr
    import gradio.routes

    from app import ui

    monkeypatch.setenv("OAUTH_CLIENT_ID", "test-client")
    monkeypatch.setenv("SPACE_AUTHOR_NAME", "Alice")
    monkeypatch.setattr(ui, "_oauth_installed", lambda: True)
    monkeypatch.setattr(gradio.routes, "attach_oauth", lambda app: None)
    demo = ui.build_app(tmp_path / "runs", space_mode=True, background_ticks=False, showcase_dir=None)
    try:
        assert any(isinstance(b, gr.LoginButton) for b in demo.blocks.values())
        loads = [f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "login_oauth"]
        assert len(loads) == 1
        request = types.SimpleNamespace(session_hash="s-1", headers={}, client=None)
        profile = gr.OAuthProfile({"name": "A", "preferred_username": "alice", "profile": "", "picture": ""})
        assert "owner rights for this session" in loads[0](profile, request=request)
        assert demo.jagg_guard.is_owner("s-1")
        other = gr.OAuthProfile({"name": "M", "preferred_username": "mallory", "profile": "", "picture": ""})
        loads[0](other, request=types.SimpleNamespace(session_hash="s-2", headers={}, client=None))
        assert not demo.jagg_guard.is_owner("s-2")
        assert loads[0](None, request=request) == ""  # not signed in: nothing to say
    finally:
        demo.jagg_stop_ticker.set()
        demo.jagg_manager.shutdown()


def test_without_gradio_oauth_extras_the_app_still_starts_with_the_password(tmp_path, monkeypatch, capsys):
    import importlib.util

    import gradio as gr

    from app import ui

    monkeypatch.setenv("OAUTH_CLIENT_ID", "test-client")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "authlib" else real(n, *a))
    demo = ui.build_app(tmp_path / "runs", space_mode=True, background_ticks=False, showcase_dir=None)
    try:
        assert not any(isinstance(b, gr.LoginButton) for b in demo.blocks.values())
        assert "owner login by password only" in capsys.readouterr().out
    finally:
        demo.jagg_manager.shutdown()


def test_publisher_copies_are_bounded_oldest_first(tmp_path, monkeypatch):
    """Past max_bytes the oldest copies go, down to half of it; the copy just made stays, and a copy that
    went is made again when its image is shown again."""
    runs = tmp_path / "runs"
    (runs / "run-0001").mkdir(parents=True)
    monkeypatch.setattr(space.tempfile, "gettempdir", lambda: str(tmp_path / "elsewhere"))
    monkeypatch.chdir(runs / "run-0001")  # neither the working directory nor the temp dir holds the runs
    publisher = space.FilePublisher(runs, public_dir=tmp_path / "public", max_bytes=8000)
    assert not publisher.direct
    images = []
    for i in range(12):
        image = runs / "run-0001" / f"{i:02d}.png"
        image.write_bytes(bytes([i]) * 1000)
        images.append(image)
    copies = []
    for i, image in enumerate(images):
        copies.append(Path(publisher(image)))
        os.utime(copies[-1], ns=(i * 10**9, i * 10**9))  # copy i is the i-th oldest
        # checked after every 1000 bytes copied: at most max_bytes + 1000 between checks
        assert sum(p.stat().st_size for p in (tmp_path / "public").glob("*/*")) <= 8000 + 1000, i
    assert copies[-1].exists() and not copies[0].exists()
    left = sorted(p.name for p in (tmp_path / "public").glob("*/*"))
    assert left == [f"{i:02d}.png" for i in range(12 - len(left), 12)]  # the newest stay
    assert Path(publisher(images[0])).read_bytes() == bytes([0]) * 1000  # made again

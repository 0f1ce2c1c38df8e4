"""The studio's Vote tab at handler level: the pending group and its prompt, a vote by button, the counter and
the agreement curve, the refusals in one line, and in a Space only the signed-in owner votes."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from PIL import Image

from app.space import FilePublisher, SpaceGuard
from app.vote import MAX_PICKS, Vote, picks_runs, vote_view
from jagg_engine.store import open_store


def picks_run(root: Path, voter: str = "owner") -> tuple[object, int]:
    store = open_store(root)
    config = {"rewards": {"picks": 1.0}, "reward_options": {"picks": {"voter": voter}}}
    run_id, folder = store.create_run_folder("mine", config)
    store.claim(run_id, ("queued",), os.getpid())
    (folder / "picks").mkdir()
    paths = []
    for k in range(3):
        Image.new("RGB", (8, 8), (80 * k, 0, 0)).save(folder / "picks" / f"g00_{k}.png")
        paths.append(f"picks/g00_{k}.png")
    store.post_pick_groups(run_id, 4, [{"group_index": 0, "prompt": "red circle left", "paths": paths}])
    store.log_step(run_id, 3, {"picks/agreement": 0.6, "picks/agreement_all": 0.55, "picks/wanted": 10.0})
    return store, run_id


def handlers(root: Path, store, space: bool = False) -> Vote:
    guard = SpaceGuard(root, space, owner_password="secret")
    return Vote(SimpleNamespace(store=store, space=space, guard=guard, publish=FilePublisher(root)))


class Request:
    def __init__(self, session: str):
        self.session_hash = session


def test_the_tab_shows_the_pending_group_and_a_click_casts_a_vote(tmp_path: Path) -> None:
    store, run_id = picks_run(tmp_path)
    h = handlers(tmp_path, store)
    assert h.default_run() == run_id and [r["id"] for r in picks_runs(store)] == [run_id]
    status, images, count, figure, key, *buttons, skip = h.show(run_id)
    assert "waiting for your picks" in status and "red circle left" in status and "step 4" in status
    assert [caption for _, caption in images] == ["1", "2", "3"] and all(Path(p).is_file() for p, _ in images)
    assert [b["visible"] for b in buttons] == [True] * 3 + [False] * (MAX_PICKS - 3) and skip["visible"]
    assert count == "votes cast: **0** of **10** wanted (10 still wanted)"
    assert [t.y[0] for t in figure.data] == [0.6, 0.55]  # this step's and every vote's agreement
    assert key == [run_id, 4, 0]
    message, status, images, count, *_ = h.cast(run_id, key, 1, "best")
    assert message == "Voted: image 2 is the best of group 0, step 4."
    assert [(v["sample"], v["choice"], v["voter"]) for v in store.votes(run_id)] == [(1, "best", "owner")]
    assert count.startswith("votes cast: **1** of **10**")
    assert "is sampling or training" in status  # the voted group is no longer shown, though still pending
    again = h.cast(run_id, key, 0, "worst")[0]
    assert (
        again.startswith("**Refused:** vote: 'owner' already voted on group 0 of step 4")
        and "\n" not in again
    )
    store.post_pick_groups(
        run_id, 5, [{"group_index": 1, "prompt": "blue square top", "paths": ["picks/g00_0.png"]}]
    )
    assert "step 5, group 1" in h.show(run_id)[0]  # the next group without a vote
    store.close_pick_groups(run_id)
    assert "is sampling or training" in h.show(run_id)[0]
    assert (
        h.cast(run_id, None, 0, "best")[0]
        == "**Refused:** vote: no group is shown; nothing is waiting for your picks."
    )


def test_a_skip_and_a_run_that_takes_another_voter(tmp_path: Path) -> None:
    store, run_id = picks_run(tmp_path, voter="scripted")
    h = handlers(tmp_path, store)
    reply = h.cast(run_id, [run_id, 4, 0], None, "skip")[0]
    assert reply == f"**Refused:** vote: run {run_id} takes votes from 'scripted' only, not from 'owner'"
    mine, _ = picks_run(tmp_path / "other")
    other = handlers(tmp_path / "other", mine)
    run2 = mine.list_runs()[0]["id"]
    assert other.cast(run2, [run2, 4, 0], None, "skip")[0] == "Skipped group 0 of step 4."
    assert [(v["sample"], v["choice"]) for v in mine.votes(run2)] == [(None, "skip")]


def test_in_a_space_only_the_signed_in_owner_votes(tmp_path: Path) -> None:
    store, run_id = picks_run(tmp_path)
    h = handlers(tmp_path, store, space=True)
    key = [run_id, 4, 0]
    refused = h.cast(run_id, key, 0, "best", Request("visitor"))[0]
    assert refused == "**Refused:** vote: only the Space's owner (signed in) votes on its runs."
    assert store.votes(run_id) == []
    h.guard.login("owner-session", "secret")
    assert h.cast(run_id, key, 0, "best", Request("owner-session"))[0].startswith("Voted: image 1")
    assert len(store.votes(run_id)) == 1


def test_views_without_a_pending_group(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    assert vote_view(store, None)["status"].startswith("No picks run")
    plain = store.create_run_folder("plain", {"rewards": {"shapes": 1.0}})[0]
    assert vote_view(store, plain)["status"] == f"Run #{plain} does not train on picks."
    assert vote_view(store, 999)["status"] == "No run #999."
    queued = store.create_run_folder("picks", {"rewards": {"picks": 1.0}})[0]
    view = vote_view(store, queued)
    assert (
        view["status"] == f"Run #{queued} is queued; votes are taken only while it runs."
        and view["group"] is None
    )


def test_the_keys_script_clicks_the_tabs_buttons(tmp_path: Path) -> None:
    """The page's key handler (1–9, s) finds the buttons by the ids the tab gives them, and the built app's
    head carries it; the tab's API events are named."""
    import gradio as gr

    from app import ui
    from app.vote import KEYS_SCRIPT, vote_tab

    with gr.Blocks():
        tab = vote_tab([], None)
    assert [b.elem_id for b in tab.picks] == [f"vote-pick-{k}" for k in range(1, MAX_PICKS + 1)]
    assert tab.skip.elem_id == "vote-skip"
    assert (
        '"vote-pick-" + e.key' in KEYS_SCRIPT and '"vote-skip"' in KEYS_SCRIPT and '"vote-tab"' in KEYS_SCRIPT
    )
    store, run_id = picks_run(tmp_path / "runs")
    demo = ui.build_app(tmp_path / "runs", space_mode=False, background_ticks=False, showcase_dir=None)
    assert KEYS_SCRIPT in demo.jagg_head
    api = {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name}
    assert api["cast_vote"](run_id, 4, 0, 0, "best") == "**Refused:** vote sample: counted from 1."
    assert api["cast_vote"](run_id, 4, 0, 3, "worst") == "Voted: image 3 is the worst of group 0, step 4."
    assert [(v["sample"], v["choice"]) for v in store.votes(run_id)] == [(2, "worst")]
    assert (
        api["vote_view"](run_id)[1]
        == f"Run #{run_id} is sampling or training; its next groups come with its next step."
    )

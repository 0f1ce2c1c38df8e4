"""Live's plots sent once, then only their new points.

A Live plot is drawn whole when a run is picked (or the page loads, or Refresh is pressed); on a timer tick
after the run logged new steps the server draws the figure again, as always, but sends only what changed
against the figure the page holds: the points appended to each trace's arrays (``x``, ``y``, ``customdata``
and the series in ``meta`` that :mod:`app.client` recomputes traces from) and the scalar properties and
layout entries whose value changed (a curve switching to lines past :data:`app.client.MARKERS_UP_TO` points,
the reward axis's fitted range). The page's script (``jaggView.extend`` in :data:`app.client.SCRIPT`)
appends them and applies the view controls to the new points, as it does when a control moves.

The server knows what the page holds from a per-session state (:func:`drawn_state`): the figure last sent
for each panel, as plain JSON, and its revision (:func:`revision`, a digest of that JSON, also written into
the figure's ``layout.meta``). A delta names the revision it extends; a page that holds another revision
(an answer overtaken by another) asks for the panels again (the hidden ``live-resync`` button) rather than
append to the wrong base. A change that is not an append (a trace added or gone, a point rewritten) sends
the figure whole.

A plot that no longer changes gets no delta, so nothing would catch the page holding another figure than
the session's record says (two answers landed in another order than they were written). Each tick
therefore also carries the revisions the page's plots hold (``jaggView.held``); :func:`trusted` drops
from the record every plot that differs, and the tick sends those whole.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go

from app.client import META_KEY

Path = str  # a dotted path into a trace or the layout: "marker.size", "meta.jagg.y"


def plain(fig: go.Figure) -> dict[str, Any]:
    """``fig`` as the JSON the page receives, with plotly's binary arrays (``{"dtype", "bdata"}``) decoded
    into lists (NaN as None) so that two figures compare point by point."""
    return _decode(json.loads(fig.to_json()))


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
            if "shape" in value:
                shape = value["shape"]
                array = array.reshape(
                    [int(n) for n in str(shape).split(",")] if isinstance(shape, str) else shape
                )
            return _finite(array.tolist())
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _finite(values: Any) -> Any:
    if isinstance(values, list):
        return [_finite(v) for v in values]
    if isinstance(values, float) and not math.isfinite(values):
        return None
    return values


def revision(figure: Mapping[str, Any]) -> str:
    """A digest of a plain figure (its layout's revision stamp left out): equal figures, equal revisions."""
    layout = dict(figure.get("layout") or {})
    meta = dict(layout.get("meta") or {})
    jagg = {k: v for k, v in dict(meta.get(META_KEY) or {}).items() if k != "rev"}
    layout["meta"] = {**meta, META_KEY: jagg}
    text = json.dumps({"data": figure.get("data"), "layout": layout}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def stamp(fig: go.Figure) -> tuple[go.Figure, dict[str, Any], str]:
    """Write ``fig``'s revision into its ``layout.meta`` (where the page reads which figure it holds).
    Returns (fig, its plain JSON, the revision)."""
    figure = plain(fig)
    rev = revision(figure)
    fig.update_layout(meta=_with(fig.layout.meta, "rev", rev))
    figure.setdefault("layout", {})["meta"] = _with(figure["layout"].get("meta"), "rev", rev)
    return fig, figure, rev


def _with(meta: Any, key: str, value: Any) -> dict[str, Any]:
    """A layout's ``meta`` with ``meta[META_KEY][key] = value``, the rest kept."""
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    return {**meta, META_KEY: {**dict(meta.get(META_KEY) or {}), key: value}}


def _leaves(value: Any, prefix: str = "") -> dict[Path, Any]:
    """A nested dict flattened to dotted paths; lists (and anything not a dict) are leaves."""
    if isinstance(value, dict) and value:
        out: dict[Path, Any] = {}
        for key, inner in value.items():
            out.update(_leaves(inner, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def _scalars(values: Any) -> bool:
    return isinstance(values, list) and all(not isinstance(v, (dict, list)) for v in values)


def delta(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any] | None:
    """What turns plain figure ``old`` into ``new`` when ``new`` only appends: ``{"n": traces, "traces":
    [{"i", "append": {path: new points}, "set": {path: value}}], "layout": {path: value}}`` (only the traces
    and entries that changed); None when it does more (a trace added, removed or reordered, a point of an
    array changed, an entry gone): the figure is then sent whole."""
    if old is None:
        return None
    old_data, new_data = list(old.get("data") or []), list(new.get("data") or [])
    if len(old_data) != len(new_data):
        return None
    traces = []
    for i, (was, now) in enumerate(zip(old_data, new_data, strict=True)):
        before, after = _leaves(was), _leaves(now)
        if (
            set(before) - set(after)
            or was.get("name") != now.get("name")
            or was.get("type") != now.get("type")
        ):
            return None
        append: dict[Path, list] = {}
        changed: dict[Path, Any] = {}
        for path, value in after.items():
            prior = before.get(path)
            if path in before and _same(prior, value):
                continue
            if _scalars(prior) and _scalars(value) and len(value) > len(prior):
                if not all(_same(a, b) for a, b in zip(prior, value[: len(prior)], strict=True)):
                    return None
                append[path] = value[len(prior) :]
            elif isinstance(prior, list) or isinstance(value, list):
                if path in before and isinstance(prior, list):
                    return None  # an array rewritten, not appended to
                changed[path] = value
            else:
                changed[path] = value
        if append or changed:
            traces.append({"i": i, "append": append, "set": changed})
    before, after = _leaves(old.get("layout") or {}), _leaves(new.get("layout") or {})
    if set(before) - set(after):
        return None
    layout = {p: v for p, v in after.items() if not (p in before and _same(before[p], v))}
    return {"n": len(new_data), "traces": traces, "layout": layout}


def drawn_state() -> dict[str, Any]:
    """The session's record of what its Live plots hold: ``{"run": id, "panels": {name: {"rev", "figure"}}}``."""
    return {"run": None, "panels": {}}


def trusted(drawn: Any, page: Any) -> tuple[Any, list[str]]:
    """``drawn`` (:func:`drawn_state`) without the panels the page does not hold: ``page`` is what the
    page's plots hold as a tick leaves it (``{"live-<panel>": revision}``; a plot not drawn yet, or a page
    without its script, names none and is trusted). Returns (the record, the panels left out: the tick sends
    them whole)."""
    if not isinstance(drawn, Mapping) or not isinstance(page, Mapping):
        return drawn, []
    panels = dict(drawn.get("panels") or {})
    off = [
        name
        for name, entry in panels.items()
        if isinstance(page.get(f"live-{name}"), str) and page[f"live-{name}"] != entry.get("rev")
    ]
    if not off:
        return drawn, []
    return {**drawn, "panels": {k: v for k, v in panels.items() if k not in off}}, off


def send(
    name: str, value: Any, run: int | None, drawn: Mapping[str, Any] | None, incremental: bool
) -> tuple[Any, dict[str, Any] | None, dict[str, Any] | None]:
    """Panel ``name``'s ``value`` as it goes out: (what the panel's component gets: the figure, or None
    where the page keeps what it holds or a delta carries the change; the delta, with the revision it extends (``from``) and the one it makes
    (``to``), or None; the panel's new entry in the drawn state, or None for a value that is not a
    figure). ``incremental``: a tick of the run the page holds (a pick, load or refresh sends it whole)."""
    if not isinstance(value, go.Figure):
        return value, None, None
    fig, figure, rev = stamp(value)
    entry = {"rev": rev, "figure": figure}
    held = (drawn or {}).get("panels", {}).get(name) if (drawn or {}).get("run") == run else None
    if not incremental:
        return fig, None, entry
    if held is not None and held.get("rev") == rev:
        return None, None, entry  # the page holds this figure already
    change = delta(held.get("figure"), figure) if held is not None else None
    if change is None:
        return _fresh(fig), None, entry
    return None, {"from": held.get("rev"), "to": rev, **change}, entry


_sent = itertools.count(1)


def _fresh(fig: go.Figure) -> go.Figure:
    """``fig`` marked as sent anew (``layout.meta.jagg.sent``, outside its revision and the session's record)
    for a tick that sends a plot whole: the page keeps the last whole figure it got and redraws a plot only
    for a value that differs from it, while deltas (and an answer landed out of order) may have moved the plot
    itself elsewhere."""
    return fig.update_layout(meta=_with(fig.layout.meta, "sent", next(_sent)))

"""How fast the studio's page answers, in headless Chromium (a benchmark to run on demand, not a test: the tests
assert what is deterministic, and a busy machine slows every figure here).

    python scripts/bench_ui.py                                  # 5 trials; prints medians, writes reports/app/bench-ui.json
    python scripts/bench_ui.py --trials 9 --out /tmp/ui.json
    python scripts/bench_ui.py --beside-only --trials 24 --out /tmp/beside.json   # the Live links beside a run alone
    make bench-ui

Over the 4-run Compare of ``tests/test_app_views_browser.py`` (runs #3–#6, 40 steps each, beside the shipped
showcase #1–#2), served by ``python launch.py`` in a child process, it times with the page's own clock
(``performance.now()``):

* each Compare control (x axis, smoothing, log scale, runs shown): from the input event to the first animation
  frame at which the plot shows the new view, ``--trials`` times each to a new value (the tests' own steps,
  :func:`test_app_views_browser.control_steps`); the reward level: from the input to the new time-to-reach
  line;
* links opened fresh: from the navigation's start to the first frame at which the link's tab is selected
  (``tab of …``) and at which the linked view is there (``link …``: ``/``, the showcase's curves and 8 decoded
  images; ``?tab=live&run=5``, the Live tab with run #5's progress line; ``?tab=compare&runs=3,4,5,6``, both
  Compare plots drawn), ``--trials`` loads each;
* the Live links again while a run trains beside (the tests' stand-in trainer: a step every 0.6 s, an image
  every second step), to the training run and to run #5 in turn, ``--trials`` loads each.

Prints one line per figure (median, min, max in ms) and the machine's load average, and writes them as JSON to
``--out``. Needs Debian's chromium and chromium-driver (``make browser``) and selenium.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from browser import live_ready  # noqa: E402  (tests/browser.py: the ready check the link test waits on too)

# the page's clock at the first frame at which `ready` (a JS expression) holds; -1 past the limit
READY = """
const [ready, limit, finish] = arguments;
const check = new Function('return (' + ready + ');');
const poll = () => {
  let ok = false;
  try { ok = check(); } catch (e) { ok = false; }
  if (ok) return finish(performance.now());
  if (performance.now() > limit) return finish(-1);
  requestAnimationFrame(poll);
};
poll();
"""


PLOT_DRAWN = "(() => { const g = document.querySelector('#{id} .js-plotly-plot'); return !!(g && g._fullData && g.data.some(t => t.meta && t.meta.jagg)); })()"
LINKS = {
    "/": "document.querySelectorAll('#showcase-curves .curve').length >= 4 && "
    "[...document.querySelectorAll('#compare-gallery img')].filter(i => i.complete && i.naturalWidth > 0).length >= 8",
    "?tab=live&run=5": live_ready(5),
    "?tab=compare&runs=3,4,5,6": " && ".join(
        PLOT_DRAWN.replace("{id}", i) for i in ("compare-plot", "compare-metrics")
    ),
}

TABS = {"?tab=live&run=5": "Live", "?tab=compare&runs=3,4,5,6": "Compare"}
SELECTED = (
    "(document.querySelector('button[role=tab][aria-selected=true]') || {innerText: ''}).innerText.trim()"
)


def summary(values: list[float]) -> dict[str, float | int]:
    ok = [v for v in values if v >= 0]
    return {
        "median_ms": round(statistics.median(ok), 1) if ok else -1,
        "min_ms": round(min(ok), 1) if ok else -1,
        "max_ms": round(max(ok), 1) if ok else -1,
        "n": len(values),
        "never": len(values) - len(ok),
        "over_8s": sum(1 for v in values if v < 0 or v > 8000),  # the stalls (docs/app.md)
        "all_ms": [round(v, 1) for v in values],  # in the order taken (-1: never within the limit)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="times each control is moved, each link opened")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "app" / "bench-ui.json")
    parser.add_argument(
        "--beside-only", action="store_true",
        help="only the Live links while a run trains beside (--trials of each): where pages stalled",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error(f"--trials: must be >= 1, got {args.trials}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

    import test_app_views_browser as views
    from browser import chromium
    from test_app_e2e import LiveApp

    timings: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="jagg-bench-ui-") as tmp:
        views._fill(Path(tmp) / "runs")
        app = LiveApp(Path(tmp) / "runs", Path(tmp))
        app.start()
        try:
            driver = chromium("1400,2400")
            try:
                driver.set_script_timeout(120)
                for link, ready in LINKS.items() if not args.beside_only else ():
                    for _ in range(args.trials):
                        driver.get(app.url + (link if link != "/" else ""))
                        if link in TABS:  # the tab first (the page's own doing), then the view (the server's)
                            tab = f"{SELECTED} === {TABS[link]!r}"
                            ms = float(driver.execute_async_script(READY, tab, 90_000))
                            timings.setdefault(f"tab of {link}", []).append(ms)
                        ms = float(driver.execute_async_script(READY, ready, 90_000))
                        timings.setdefault(f"link {link}", []).append(ms)
                # the same Live links while a run trains beside (a step every 0.6 s, with images): the usual case
                with views.Trainer(Path(tmp) / "runs") as trainer:
                    for _ in range(args.trials):
                        for run_id in (trainer.run_id, 5):
                            link = f"?tab=live&run={run_id}"
                            driver.get(app.url + link)
                            ms = float(driver.execute_async_script(READY, live_ready(run_id), 90_000))
                            which = "the training run" if run_id == trainer.run_id else "run 5"
                            timings.setdefault(f"link Live of {which}, a run training", []).append(ms)
                if not args.beside_only:  # the Compare controls
                    driver.get(app.url + "?tab=compare&runs=3,4,5,6")
                    driver.execute_async_script(READY, LINKS["?tab=compare&runs=3,4,5,6"], 120_000)
                    for trial in range(args.trials):
                        for name, action, plot_id, done in views.control_steps(driver, trial):
                            ms = views.timed(driver, action, plot_id, done, limit_ms=10_000)
                            timings.setdefault(name, []).append(ms)
                        for text, level, whose in views.LEVELS:
                            said = f"Time to reach eval reward {level:g} ({whose})."
                            ms = views.timed_text(
                                driver, views._set_text("compare-level", text), said, 10_000
                            )
                            timings.setdefault("reward level", []).append(ms)
            finally:
                driver.quit()
        finally:
            app.stop()
    figures = {name: summary(values) for name, values in timings.items()}
    report = {
        "what": "ms in headless Chromium, page clock: a control from its input to the redrawn plot; a link "
        "from the navigation's start to the linked view",
        "trials": args.trials,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "figures": figures,
    }
    width = max(len(n) for n in figures)
    for name, f in figures.items():
        never = f" ({f['never']} never)" if f["never"] else ""
        never += f" ({f['over_8s']} over 8 s)" if f["over_8s"] else ""
        print(
            f"{name:<{width}}  median {f['median_ms']:>8.1f} ms  [{f['min_ms']:.1f} – {f['max_ms']:.1f}]{never}"
        )
    print(f"load average {report['load_average']} on {report['cpus']} CPUs")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The race as one self-contained SVG (no script, no external font or file): seed curves, seed means, the
level and where each variant first reaches it."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from .summary import _secs

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _ticks(lo: float, hi: float, n: int = 5) -> list[tuple[float, str]]:
    """About ``n`` round ticks in [lo, hi] (1, 2 or 5 × a power of ten apart), each with its label, written
    with as many decimals as the spacing needs."""
    raw = ((hi - lo) or abs(hi) or 1.0) / n
    power = math.floor(math.log10(raw))
    step = next(m * 10.0**power for m in (1, 2, 5, 10) if m * 10.0**power >= raw)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    first = math.ceil(lo / step - 1e-9) * step
    count = int((hi - first) / step + 1e-9) + 1
    return [(first + i * step, f"{first + i * step:.{decimals}f}") for i in range(count)]


def race_svg(summary: Mapping[str, Any], width: int = 900, height: int = 460) -> str:
    """The race as one static SVG: each variant's per-seed eval curves (thin) and seed mean (thick, dots)
    against training time, the level (dashed) and where each seed-mean curve first reaches it (a diamond and a
    dotted drop to the time axis). Self-contained: no script, no external font or file."""
    variants = summary["variants"]
    pts = [
        (t, y)
        for r in variants
        for c in [r["curve"], *r["curves_per_seed"].values()]
        for t, y in zip(c["time_s"], c["eval"])
    ]
    level = summary["level"]
    x1 = max([t for t, _ in pts] + [1e-9])
    ys = [y for _, y in pts] + [level]
    pad = max(0.06 * (max(ys) - min(ys)), 1e-3)
    y0, y1 = min(ys) - pad, max(ys) + pad
    left, right, top, bottom = 64, 24, 40, 64 + 18 * len(variants)

    def px(x: float) -> float:
        return left + x / x1 * (width - left - right)

    def py(y: float) -> float:
        return top + (y1 - y) / (y1 - y0) * (height - top - bottom)

    base = summary["baseline"]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        ' role="img" aria-label="eval reward against training time" style="font: 12px sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="{left}" y="22" font-size="14">Eval reward against training wall time (evals left out); '
        f"seed mean thick, seeds thin{' (partial: the race did not finish)' if summary.get('partial') else ''}"
        "</text>",
    ]
    for t, label in _ticks(0.0, x1):
        out.append(
            f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{height - bottom}" stroke="#eee"/>'
            f'<text x="{px(t):.1f}" y="{height - bottom + 16}" text-anchor="middle">{label}</text>'
        )
    for y, label in _ticks(y0, y1, 6):
        out.append(
            f'<line x1="{left}" y1="{py(y):.1f}" x2="{width - right}" y2="{py(y):.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{label}</text>'
        )
    out += [
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>',
        f'<text x="{(left + width - right) / 2}" y="{height - bottom + 34}" text-anchor="middle">'
        "training wall time (s)</text>",
        f'<text transform="translate(16 {(top + height - bottom) / 2}) rotate(-90)" text-anchor="middle">'
        "eval reward</text>",
        f'<line class="level" x1="{left}" y1="{py(level):.1f}" x2="{width - right}" y2="{py(level):.1f}"'
        f' stroke="#555" stroke-dasharray="6 4"/>',
        f'<text x="{width - right - 4}" y="{py(level) - 6:.1f}" text-anchor="end" fill="#555">'
        f"{html.escape(base)}'s final eval {level:.4f}</text>",
    ]
    for i, r in enumerate(variants):
        color = _COLORS[i % len(_COLORS)]
        name = html.escape(r["variant"])
        for seed, c in r["curves_per_seed"].items():
            points = " ".join(f"{px(t):.1f},{py(y):.1f}" for t, y in zip(c["time_s"], c["eval"]))
            out.append(
                f'<polyline class="seed" data-variant="{name}" data-seed="{seed}" fill="none" stroke="{color}"'
                f' stroke-opacity="0.35" stroke-width="1.2" points="{points}"><title>{name} seed {seed}</title>'
                "</polyline>"
            )
        c = r["curve"]
        points = " ".join(f"{px(t):.1f},{py(y):.1f}" for t, y in zip(c["time_s"], c["eval"]))
        out.append(
            f'<polyline class="mean" data-variant="{name}" fill="none" stroke="{color}" stroke-width="2.5"'
            f' points="{points}"><title>{name}, seed mean</title></polyline>'
        )
        out += [
            f'<circle cx="{px(t):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>'
            for t, y in zip(c["time_s"], c["eval"])
        ]
        reach = r["time_to_level_s"]
        if reach is not None:
            x, y = px(reach), py(level)
            out.append(
                f'<g class="reach" data-variant="{name}" data-time="{reach:.6g}">'
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{height - bottom}" stroke="{color}"'
                ' stroke-dasharray="2 3"/>'
                f'<path d="M{x:.1f} {y - 6:.1f} L{x + 6:.1f} {y:.1f} L{x:.1f} {y + 6:.1f} L{x - 6:.1f} {y:.1f} Z"'
                f' fill="{color}"/></g>'
            )
        ly = height - bottom + 52 + 18 * i
        ratio = r["ratio_to_baseline_time"]
        when = (
            "does not reach it"
            if reach is None
            else f"reaches it at {_secs(reach)} ({ratio:.2f}× {base}'s time)"
        )
        fe = r["final_eval_seed_mean"]
        final = "" if fe is None else f"; final eval {fe:.4f}"
        label = html.escape(f"{r['variant']}{' (baseline)' if r['baseline'] else ''}: {when}{final}")
        out.append(
            f'<line x1="{left}" y1="{ly - 4}" x2="{left + 28}" y2="{ly - 4}" stroke="{color}" stroke-width="2.5"/>'
            f'<text x="{left + 36}" y="{ly}">{label}</text>'
        )
    return "".join(out) + "</svg>\n"

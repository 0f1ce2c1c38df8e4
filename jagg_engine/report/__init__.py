"""Runs as tables, figures, images and one self-contained HTML page (``jagg report``).

:mod:`.tables` (labels, durations, history, speedups), :mod:`.figures` (reward curves, step times, a static
SVG), :mod:`.images` (eval images side by side), :mod:`.axes` (the x axes every figure shares) and
:mod:`.page` (the report itself and its command line). The app shows the same tables and figures.
"""

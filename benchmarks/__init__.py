"""Benchmarks: runnable scripts that put speechpipe beside its contenders on the same data.

``python -m benchmarks`` runs every ``bench_*.py`` module at full size; ``--tiny`` runs each
once at a tiny size (``make test`` does this so that none of them rots). Figures are printed,
never asserted.
"""

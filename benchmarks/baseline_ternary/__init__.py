"""Frozen copy of the ternary kernels as they were before session 4 (main at 1dbb5d9).

``benchmarks/bench_ternary.py`` times these next to the current kernels, so one
GPU run measures before and after side by side. Not part of the library; delete
once the session-4 results are recorded.
"""

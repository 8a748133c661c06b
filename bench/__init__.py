"""hyperplan's benchmarks: `make bench` (or `python -m bench [--quick] [search|http|memory ...]`).

They print figures next to their targets; they never pass or fail on timings.
"""

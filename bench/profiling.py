"""cProfile summaries: own time grouped by where the code lives, then the busiest functions."""

from __future__ import annotations

import cProfile
import io
import pstats
from collections import Counter
from pathlib import Path

from bench.report import line

_ROOT = Path(__file__).resolve().parent.parent


def _group(filename: str, function: str) -> str:
    """``hyperplan.services.plans.plans``, ``sqlalchemy``, ``stdlib json``, or a C function's own name."""
    if filename == "~":
        return f"C: {function.strip('<>')}"
    path = Path(filename)
    if "site-packages" in path.parts:
        return path.parts[path.parts.index("site-packages") + 1].removesuffix(".py")
    try:
        return ".".join(path.resolve().relative_to(_ROOT).with_suffix("").parts)
    except ValueError:
        return f"stdlib {path.stem}"


def print_summary(profiler: cProfile.Profile, *, groups: int = 10, functions: int = 12) -> None:
    stats = pstats.Stats(profiler)
    own: Counter[str] = Counter()
    for (filename, _, function), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        own[_group(filename, function)] += tottime
    total = sum(own.values()) or 1.0
    line(f"  own time by where the code lives (total {total:.2f} s under the profiler):")
    for name, seconds in own.most_common(groups):
        line(f"    {seconds / total:6.1%}  {name}")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(functions)
    rows = [row for row in out.getvalue().splitlines() if row.strip()]
    start = next((i for i, row in enumerate(rows) if row.lstrip().startswith("ncalls")), 0)
    line("  busiest functions (own time):")
    for row in rows[start:]:
        line("    " + row.strip()[:150])

"""How big a bench run is: the full figures, a quick look, or a smoke run for the test suite."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

T = TypeVar("T")


class Scale(StrEnum):
    FULL = "full"  # `make bench`: the figures the README quotes
    QUICK = "quick"  # `--quick`: small counts and short phases, rough figures in about two minutes
    SMOKE = "smoke"  # `--smoke`: the least that runs every path (the test suite's); its figures mean nothing

    def pick(self, full: T, quick: T, smoke: T) -> T:
        return {Scale.FULL: full, Scale.QUICK: quick, Scale.SMOKE: smoke}[self]

"""The one rule that cuts a page by bytes (hyperplan/core/page_bytes.py): items are taken in page order
while they fit, the first always, so that paging moves on however large an item is."""

from __future__ import annotations

from hyperplan.core import log_events
from hyperplan.core.page_bytes import MAX_PAGE_BYTES, PageBytes, fitting, utf8_bytes


def test_a_page_takes_items_while_they_fit_and_never_counts_one_it_refuses() -> None:
    page = PageBytes(100)
    assert [page.take(size) for size in (40, 60, 1)] == [True, True, False]
    assert (page.used, page.items) == (100, 2)
    assert not page.fits(1) and page.fits(0)


def test_the_first_item_always_goes_in_so_that_paging_moves_on() -> None:
    page = PageBytes(100)
    assert page.take(5000) and (page.used, page.items) == (5000, 1)
    assert not page.take(0 + 1)
    assert fitting([5000, 1], 100) == 1
    assert fitting([], 100) == 0


def test_fitting_counts_the_leading_items_a_page_holds() -> None:
    assert fitting([300, 300, 300, 300], 1000) == 3
    assert fitting([300, 300, 400, 1], 1000) == 3  # exactly the bound fits; nothing more
    assert fitting([1] * 10, 1000) == 10
    assert fitting([MAX_PAGE_BYTES // 2] * 3) == 2  # the default bound: 1 MiB


def test_bytes_are_counted_in_utf8_and_an_event_adds_awss_26() -> None:
    assert utf8_bytes("abc") == 3
    assert utf8_bytes("é€😀") == 2 + 3 + 4
    assert utf8_bytes("\udcff") == 3  # a lone surrogate is counted, not refused
    assert log_events.event_bytes("€" * 10) == 30 + 26
    assert log_events.event_bytes("") == 26

"""Offering ids: spelled as they always were (the standard library's base32 of the packed claim and its
truncated HMAC), read back whole, and refused when forged."""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
from datetime import timedelta

import pytest

from hyperplan.core import offering_ids
from hyperplan.core.offering_ids import ExtensionClaim, OfferingClaim, OfferingIdError, OfferingSegment

from .support import fleet, pool, utc

KEY = b"offering-key-for-tests-0123456789"
FLEET = fleet(pool("a"), pool("b"), pool("c"))
START = utc(2026, 3, 2, 11, 30)


def claim(segments: int, count: int = 4, target: str = "training-job") -> OfferingClaim:
    day = timedelta(days=1)
    parts = tuple(
        OfferingSegment(i % 3, START + 3 * i * day, START + (3 * i + 2) * day) for i in range(segments)
    )
    return OfferingClaim("123456789012", START - day, target, count, parts)


def spelled_plainly(offering_id: str, prefix: str) -> str:
    """The id again, its MAC recomputed with hmac.new and spelled with the standard library's base32."""
    text = offering_id.removeprefix(prefix).upper()
    body = base64.b32decode(text + "=" * (-len(text) % 8))[:-10]
    mac = hmac.new(KEY, body, hashlib.sha256).digest()[:10]
    return prefix + base64.b32encode(body + mac).decode().rstrip("=").lower()


def test_ids_are_spelled_as_the_standard_library_spells_them_and_read_back() -> None:
    claims = [claim(1), claim(2, 64, "hyperpod-cluster"), claim(1, 1), claim(4)]
    ids = offering_ids.encode_all(claims, key=KEY, fleet=FLEET)
    assert len(set(ids)) == len(ids)  # a nonce apiece
    for made, asked in zip(ids, claims, strict=True):
        assert made == spelled_plainly(made, offering_ids.PREFIX)
        assert offering_ids.decode(made, key=KEY, fleet=FLEET) == asked
    assert offering_ids.encode_all([], key=KEY, fleet=FLEET) == []
    one = offering_ids.encode(claims[0], key=KEY, fleet=FLEET)
    assert one == spelled_plainly(one, offering_ids.PREFIX) and one not in ids


def test_every_length_of_the_base32_tail_matches_the_standard_library() -> None:
    rng = random.Random(3)
    for size in range(0, 23):
        raw = [rng.randbytes(size) for _ in range(3)]
        assert offering_ids._base32(raw) == [base64.b32encode(r).decode().rstrip("=").lower() for r in raw]


def test_extension_ids_read_back_and_forged_ids_are_refused() -> None:
    asked = ExtensionClaim("123456789012", START, 42, START, START + timedelta(days=2))
    made = offering_ids.encode_extension(asked, key=KEY, fleet=FLEET)
    assert made == spelled_plainly(made, offering_ids.EXTENSION_PREFIX)
    assert offering_ids.decode_extension(made, key=KEY, fleet=FLEET) == asked
    good = offering_ids.encode(claim(2), key=KEY, fleet=FLEET)
    forged = good[:-1] + ("a" if good[-1] != "a" else "b")
    with pytest.raises(OfferingIdError):
        offering_ids.decode(forged, key=KEY, fleet=FLEET)
    with pytest.raises(OfferingIdError):
        offering_ids.decode(good, key=b"another key", fleet=FLEET)

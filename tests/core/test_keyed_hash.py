"""The kept HMAC-SHA256 gives exactly the standard library's MAC, for keys of every length the padding
treats apart (shorter than, equal to and longer than SHA-256's block)."""

from __future__ import annotations

import hmac

import pytest

from hyperplan.core.keyed_hash import hmac_sha256


@pytest.mark.parametrize("key_length", [0, 1, 32, 63, 64, 65, 200])
def test_the_same_mac_as_hmac_digest(key_length: int) -> None:
    key = bytes(range(key_length))
    for body in (b"", b"x", bytes(range(256)) * 3):
        assert hmac_sha256(key)(body) == hmac.digest(key, body, "sha256")


def test_each_key_signs_with_its_own_mac() -> None:
    body = b"the same body"
    assert hmac_sha256(b"one key")(body) != hmac_sha256(b"another key")(body)
    assert hmac_sha256(b"one key")(body) == hmac.digest(b"one key", body, "sha256")

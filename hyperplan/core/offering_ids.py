"""Offering ids that carry their own offering.

A search writes nothing: each offering's id is the offering itself (who searched, until when it may be
bought, the target, the count and each segment's pool and times), packed, signed with the service's
key and spelled in the alphabet the SageMaker model allows (`[a-z0-9\\-]+`, at most 256 characters).
Buying decodes and verifies it; the plan row keeps the id, unique, so that an offering is bought once.
The fleet's fingerprint is inside, so an offering made before the fleet file changed is refused
rather than sold at a stale price. A price is not carried whole: it follows from the segments, the fleet
and each segment's price multiplier (core/pricing.py), which is carried, in ten-thousandths, so that an
offering costs what the search priced it at even if the calendar changed in between. Version 1 ids
(before multipliers) still decode, each segment at the list price.
"""

from __future__ import annotations

import base64
import hmac
import os
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

import numpy as np

from hyperplan.core.fleet import Fleet
from hyperplan.core.keyed_hash import hmac_sha256

PREFIX = "tpo-"
_VERSION = 2
# version, fleet fingerprint, nonce, account, expiry, target, count, segments
_HEADER = struct.Struct(">B4s4sQIBHB")
_SEGMENT = struct.Struct(">HIIH")  # pool index, start, end (epoch seconds), multiplier (1/10,000ths)
_SEGMENT_V1 = struct.Struct(">HII")  # without the multiplier: the list price
_MULTIPLIER_UNITS = 10_000
_EXTENSION_VERSION = 1
_MAC_BYTES = 10
TARGETS = ("training-job", "hyperpod-cluster")


class OfferingIdError(ValueError):
    """The id is malformed, forged, or was made for another fleet."""


@dataclass(frozen=True)
class OfferingSegment:
    pool_index: int
    start: datetime
    end: datetime
    multiplier: Decimal = Decimal(1)  # of the list price (core/pricing.py), to four places


@dataclass(frozen=True)
class OfferingClaim:
    account_id: str
    expires_at: datetime
    target: str
    count: int
    segments: tuple[OfferingSegment, ...]


# Unique, not secret (the MAC is what makes an id unforgeable): drawn from a generator the OS seeds once
# per process rather than a system call per offering.
_nonces = random.Random()
os.register_at_fork(after_in_child=_nonces.seed)


def _nonce() -> bytes:
    return _nonces.getrandbits(32).to_bytes(4, "big")


def encode(claim: OfferingClaim, *, key: bytes, fleet: Fleet) -> str:
    return encode_all([claim], key=key, fleet=fleet)[0]


def encode_all(claims: Sequence[OfferingClaim], *, key: bytes, fleet: Fleet) -> list[str]:
    """:func:`encode` of each claim (a search's offerings), spelled out in one go."""
    fingerprint, raw = fleet.fingerprint(), []
    for claim in claims:
        body = _HEADER.pack(
            _VERSION,
            fingerprint,
            _nonce(),  # two searches that find the same capacity still get two ids
            int(claim.account_id),
            _seconds(claim.expires_at),
            TARGETS.index(claim.target),
            claim.count,
            len(claim.segments),
        ) + b"".join(
            _SEGMENT.pack(s.pool_index, _seconds(s.start), _seconds(s.end), _units(s.multiplier))
            for s in claim.segments
        )
        raw.append(body + _mac(key, body))
    return [PREFIX + text for text in _base32(raw)]


def _mac(key: bytes, body: bytes) -> bytes:
    return hmac_sha256(key)(body)[:_MAC_BYTES]


_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz234567", dtype=np.uint8)
_FIVE_BITS = np.array([16, 8, 4, 2, 1], dtype=np.uint8)


def _base32(raw: Sequence[bytes]) -> list[str]:
    """Each of ``raw`` in base32 (RFC 4648), lower case, without the ``=`` padding: what
    ``base64.b32encode(r).decode().rstrip("=").lower()`` gives, for all at once (the standard library's
    encoder is written in Python, a loop per 5 bytes; this is a few array operations for a search)."""
    padded = [r + bytes(-len(r) % 5) for r in raw]
    bits = np.unpackbits(np.frombuffer(b"".join(padded), dtype=np.uint8))
    text = _ALPHABET[bits.reshape(-1, 5) @ _FIVE_BITS].tobytes().decode("ascii")
    found, offset = [], 0
    for r, p in zip(raw, padded, strict=True):
        found.append(text[offset : offset + -(-len(r) * 8 // 5)])
        offset += len(p) * 8 // 5
    return found


def decode(offering_id: str, *, key: bytes, fleet: Fleet) -> OfferingClaim:
    raw = _unpack_text(offering_id)
    body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
    if not hmac.compare_digest(mac, _mac(key, body)):
        raise OfferingIdError("signature does not match")
    version, fingerprint, _nonce, account, expires, target, count, n_segments = _HEADER.unpack_from(body)
    if version not in (1, _VERSION) or fingerprint != fleet.fingerprint():
        raise OfferingIdError("made for another version of the fleet")
    each = _SEGMENT if version == _VERSION else _SEGMENT_V1
    if len(body) != _HEADER.size + n_segments * each.size or target >= len(TARGETS):
        raise OfferingIdError("malformed")
    segments = tuple(
        OfferingSegment(
            fields[0], _time(fields[1]), _time(fields[2]), _multiplier(fields[3] if len(fields) > 3 else None)
        )
        for fields in (each.unpack_from(body, _HEADER.size + i * each.size) for i in range(n_segments))
    )
    if any(s.pool_index >= len(fleet.pools) for s in segments):
        raise OfferingIdError("names a pool the fleet does not have")
    return OfferingClaim(f"{account:012d}", _time(expires), TARGETS[target], count, segments)


def _unpack_text(offering_id: str) -> bytes:
    if not offering_id.startswith(PREFIX):
        raise OfferingIdError("not a training plan offering id")
    text = offering_id.removeprefix(PREFIX).upper()
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (ValueError, base64.binascii.Error) as exc:  # type: ignore[attr-defined]
        raise OfferingIdError("not base32") from exc
    if len(raw) < _HEADER.size + _MAC_BYTES:
        raise OfferingIdError("too short")
    if _base32([raw])[0] != offering_id.removeprefix(PREFIX):
        # The last character may carry unused bits: another spelling of the same bytes would decode,
        # and pass the signature, as a second id of one offering (which must be bought once).
        raise OfferingIdError("not spelled as the service spells it")
    return raw


def _units(multiplier: Decimal) -> int:
    units = multiplier * _MULTIPLIER_UNITS
    if units != units.to_integral_value() or not 0 < units < 1 << 16:
        raise ValueError(f"a price multiplier of {multiplier} cannot be carried (four places, under 6.5536)")
    return int(units)


def _multiplier(units: int | None) -> Decimal:
    if units is None:
        return Decimal(1)
    if units == 0:
        raise OfferingIdError("malformed")
    return (Decimal(units) / _MULTIPLIER_UNITS).quantize(Decimal("0.0001"))


def _seconds(when: datetime) -> int:
    return int(when.timestamp())


def _time(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


# -- extension offerings ------------------------------------------------------------------------------

EXTENSION_PREFIX = "tpeo-"
_EXTENSION = struct.Struct(">B4s4sQIQII")  # version, fingerprint, nonce, account, expiry, plan, start, end


@dataclass(frozen=True)
class ExtensionClaim:
    account_id: str
    expires_at: datetime
    plan_id: int
    start: datetime  # the plan's end when the offering was made: a later change makes it stale
    end: datetime


def encode_extension(claim: ExtensionClaim, *, key: bytes, fleet: Fleet) -> str:
    body = _EXTENSION.pack(
        _EXTENSION_VERSION,
        fleet.fingerprint(),
        _nonce(),
        int(claim.account_id),
        _seconds(claim.expires_at),
        claim.plan_id,
        _seconds(claim.start),
        _seconds(claim.end),
    )
    return EXTENSION_PREFIX + _base32([body + _mac(key, body)])[0]


def decode_extension(offering_id: str, *, key: bytes, fleet: Fleet) -> ExtensionClaim:
    if not offering_id.startswith(EXTENSION_PREFIX):
        raise OfferingIdError("not a training plan extension offering id")
    raw = _unpack_text(PREFIX + offering_id.removeprefix(EXTENSION_PREFIX))
    body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
    if len(body) != _EXTENSION.size:
        raise OfferingIdError("malformed")
    if not hmac.compare_digest(mac, _mac(key, body)):
        raise OfferingIdError("signature does not match")
    version, fingerprint, _nonce, account, expires, plan_id, start, end = _EXTENSION.unpack(body)
    if version != _EXTENSION_VERSION or fingerprint != fleet.fingerprint():
        raise OfferingIdError("made for another version of the fleet")
    return ExtensionClaim(f"{account:012d}", _time(expires), plan_id, _time(start), _time(end))

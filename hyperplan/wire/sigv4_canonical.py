"""SigV4's canonical request: the path, query and headers in the one form both ends hash.

Public so that the client signer (``hyperplan/signing.py``), the verifier (``sigv4.py``) and the tests
share exactly one definition. The forms mirror botocore's (``botocore.auth.SigV4Auth``): a verifier
"more correct" than the signers it must accept would reject real clients.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from urllib.parse import quote, unquote_to_bytes

from hyperplan.errors import InvalidSignature

# RFC 3986 unreserved characters: the only ones SigV4 leaves unencoded in the query string.
_QUERY_SAFE = "-_.~"


@lru_cache(maxsize=1024)  # a server sees few paths (POST / above all); each costs a quote and a split
def canonical_uri(raw_path: str) -> str:
    """Canonical URI for a non-S3 service, as botocore computes it.

    Dot segments and empty segments are removed, then the already percent-encoded path is encoded
    *again* (``%20`` becomes ``%2520``): SigV4 double-encodes paths for every service but S3.
    """
    return quote(_remove_dot_segments(raw_path) or "/", safe="/~")


def _remove_dot_segments(path: str) -> str:
    if not path:
        return "/"
    kept: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if kept:
                kept.pop()
        else:
            kept.append(segment)
    leading = "/" if path.startswith("/") else ""
    trailing = "/" if path.endswith("/") and kept else ""
    return leading + "/".join(kept) + trailing


def query_pairs(raw_query: str) -> list[tuple[bytes, bytes]]:
    """Decode a raw query string into (key, value) byte pairs.

    ``+`` means a space here, as in HTML forms: botocore's ``AWSRequest.prepare`` sends spaces in
    ``params`` as ``+`` while signing them as ``%20``, and web frameworks read ``+`` as a space too.
    Bytes, not text, so a stray invalid UTF-8 escape survives the decode/encode round trip unchanged.
    """
    pairs: list[tuple[bytes, bytes]] = []
    for part in raw_query.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        pairs.append((_unquote_plus_bytes(key), _unquote_plus_bytes(value)))
    return pairs


def _unquote_plus_bytes(text: str) -> bytes:
    return unquote_to_bytes(text.replace("+", " "))


def canonical_query(pairs: Iterable[tuple[bytes, bytes]], *, exclude: frozenset[bytes]) -> str:
    """Sorted, RFC 3986-encoded ``key=value`` pairs, but those whose key is in ``exclude``."""
    encoded = sorted(
        (quote(key, safe=_QUERY_SAFE), quote(value, safe=_QUERY_SAFE))
        for key, value in pairs
        if key not in exclude
    )
    return "&".join(f"{key}={value}" for key, value in encoded)


def _canonical_header_value(value: str) -> str:
    # SigV4 "Trimall": strip, and collapse internal runs of whitespace to one space.
    return " ".join(value.split())


def canonical_headers(headers: Mapping[str, str], signed_headers: tuple[str, ...]) -> str:
    """One ``name:value`` line per signed header; ``headers`` folded to lower-case names."""
    lines = []
    for name in signed_headers:
        value = headers.get(name)
        if value is None:
            raise InvalidSignature(
                f"Header '{name}' is listed in SignedHeaders but is not present in the request."
            )
        lines.append(f"{name}:{_canonical_header_value(value)}\n")
    return "".join(lines)


def canonical_request(
    *,
    method: str,
    path: str,
    canonical_query: str,
    headers: Mapping[str, str],
    signed_headers: tuple[str, ...],
    payload_hash: str,
) -> str:
    """The SigV4 canonical request. ``headers`` must already be folded to lower-case names."""
    return "\n".join(
        [
            method.upper(),
            canonical_uri(path),
            canonical_query,
            canonical_headers(headers, signed_headers),
            ";".join(signed_headers),
            payload_hash,
        ]
    )

"""What a bucket name and an object key may be, wherever an s3:// URI is read.

Bucket names follow Amazon S3's rules for general-purpose buckets: 3 to 63 characters of lowercase letters,
digits, dots and hyphens, starting and ending with a letter or a digit, no two dots in a row, and not an
IP address. A bucket is a directory on this deployment, so these rules are also what keeps `..`, `.`
and `/` out of bucket names.

A key is a path inside its bucket: no empty, `.` or `..` segment (so no absolute key and no way up), no
NUL byte, no backslash, and no percent-encoded dot, slash or backslash, which some tool on the way could
decode into one of those.
"""

from __future__ import annotations

import re

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4_FORM = re.compile(r"[0-9]+(\.[0-9]+){3}")
_ENCODED = re.compile(r"%(2e|2f|5c|00)", re.IGNORECASE)


def bucket_name_problem(name: str) -> str | None:
    """Why `name` is not a valid bucket name, or None if it is."""
    if not 3 <= len(name) <= 63:
        return f"bucket name {name!r} must be 3 to 63 characters long"
    if not _BUCKET.fullmatch(name):
        return (
            f"bucket name {name!r} may hold only lowercase letters, digits, '.' and '-', and must start "
            "and end with a letter or a digit"
        )
    if ".." in name:
        return f"bucket name {name!r} may not hold two dots in a row"
    if _is_ip_address(name):
        return f"bucket name {name!r} may not be an IP address"
    return None


def _is_ip_address(name: str) -> bool:
    # S3 refuses anything formatted as one, leading zeros and out-of-range parts included.
    return _IPV4_FORM.fullmatch(name) is not None


def key_problem(key: str) -> str | None:
    """Why `key` could leave its bucket or cannot be held by a directory, or None. One trailing '/'
    marks a prefix; "" is the whole bucket."""
    if "\0" in key:
        return "a key may not contain NUL bytes"
    if "\\" in key:
        return "a key may not contain a backslash"
    encoded = _ENCODED.search(key)
    if encoded:
        return f"a key may not contain the encoded character {encoded.group(0)!r}"
    body = key.removesuffix("/")
    for segment in body.split("/") if key else []:
        if segment in ("", ".", ".."):
            return f"the key has a {segment or 'empty'!r} path segment, which is not allowed"
    return None

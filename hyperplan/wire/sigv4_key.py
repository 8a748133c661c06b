"""What SigV4 signs with: the credential scope, the string to sign and the day's signing key.

Shared by the client signer (``hyperplan/signing.py``) and the verifier (``sigv4.py``).
"""

from __future__ import annotations

import hashlib
import hmac
from functools import lru_cache

ALGORITHM = "AWS4-HMAC-SHA256"
TERMINATOR = "aws4_request"


def credential_scope(date: str, region: str, service: str) -> str:
    return f"{date}/{region}/{service}/{TERMINATOR}"


def string_to_sign(timestamp: str, scope: str, canonical: str) -> str:
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return f"{ALGORITHM}\n{timestamp}\n{scope}\n{digest}"


@lru_cache(maxsize=256)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """HMAC chain AWS documents for SigV4: secret -> date -> region -> service -> 'aws4_request'.

    Cached because one key signs every request a client makes that day; each derivation is four HMACs.
    """
    key = ("AWS4" + secret).encode("utf-8")
    for part in (date, region, service, TERMINATOR):
        key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
    return key

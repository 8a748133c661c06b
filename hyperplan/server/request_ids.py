"""Request ids: random UUIDs (version 4) drawn from a generator the OS seeds once per process, rather
than a system call per request (the ids must be unique, never secret)."""

from __future__ import annotations

import os
import random
import uuid

_ids = random.Random()  # seeded from os.urandom
os.register_at_fork(after_in_child=_ids.seed)  # a forked child must not repeat its parent's ids


def new_request_id() -> str:
    return str(uuid.UUID(int=_ids.getrandbits(128), version=4))

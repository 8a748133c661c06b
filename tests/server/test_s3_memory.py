"""S3 bodies are streamed to disk (issue 22): a 1 GiB PutObject leaves `hyperplan serve`'s resident
memory where it was. A real server (tests/harness.py), its RSS read from /proc while the body streams.

In the `sdk` part: a gigabyte through the loopback takes longer than the core suite's budget allows.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import Server
from tests.server.s3_requests import signed, upload_request

pytestmark = pytest.mark.sdk

GIB = 1 << 30
BLOCK = 1 << 20


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_gigabyte_upload_keeps_the_servers_memory_bounded(tmp_path: Path) -> None:
    server = Server(data_dir=tmp_path / "data").start()
    try:
        assert server.process is not None
        pid = server.process.pid
        created, _, _ = signed(server.url, "PUT", "/big")
        assert created.status_code == 200, created.text
        before = _rss_kib(pid)
        peak = [before]
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.05):
                peak[0] = max(peak[0], _rss_kib(pid))

        watcher = threading.Thread(target=watch)
        watcher.start()
        block = bytes(range(256)) * (BLOCK // 256)
        digest = hashlib.md5()

        def body() -> Iterator[bytes]:
            for index in range(GIB // BLOCK):
                piece = block[index % 256 :] + block[: index % 256]
                digest.update(piece)
                yield piece

        url, headers = upload_request(server.url, "/big/one-gib.bin", GIB)
        try:
            answer = httpx.put(url, content=body(), headers=headers, timeout=600)
        finally:
            done.set()
            watcher.join()
        assert answer.status_code == 200, answer.text
        assert answer.headers["etag"] == f'"{digest.hexdigest()}"'
        stored = server.data_dir / "s3" / "big" / "one-gib.bin"
        assert stored.stat().st_size == GIB
        growth_mib = (peak[0] - before) / 1024
        print(
            f"server RSS before {before / 1024:.0f} MiB, peak {peak[0] / 1024:.0f} MiB, "
            f"growth {growth_mib:.0f} MiB"
        )
        assert growth_mib < 64, growth_mib
        stored.unlink()
    finally:
        server.close()

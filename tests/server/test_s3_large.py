"""S3's large bodies (issue 22) on a real `hyperplan serve` (tests/harness.py): the `aws` CLI's 50 MB
multipart copy both ways, and a 1 GiB PutObject that leaves the server's resident memory where it was
(its RSS read from /proc while the body streams).

In the `sdk` part: these move more bytes through the loopback than the core suite's budget allows.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import Server
from tests.server.s3_requests import signed, upload_request

pytestmark = pytest.mark.aws

GIB = 1 << 30
BLOCK = 1 << 20


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _aws(server: Server, *args: str) -> None:
    process = server.aws(*args, check=False)  # the s3 commands print text, not JSON
    assert process.returncode == 0, (args, process.stderr)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = Server(data_dir=tmp_path_factory.mktemp("s3large") / "data").start()
    yield started
    started.close()


def test_the_cli_copies_a_50_mb_file_in_parts_both_ways_and_removes_it(
    server: Server, tmp_path: Path
) -> None:
    created, _, _ = signed(server.url, "PUT", "/cli-big")
    assert created.status_code == 200, created.text
    big = tmp_path / "big.bin"
    block = os.urandom(1 << 20)
    with big.open("wb") as out:
        for index in range(50):
            out.write(block[index:] + block[:index])
    _aws(server, "s3", "cp", str(big), "s3://cli-big/nested/big.bin")
    stored = server.data_dir / "s3" / "cli-big" / "nested" / "big.bin"
    assert stored.read_bytes() == big.read_bytes()
    head, _, _ = signed(server.url, "HEAD", "/cli-big/nested/big.bin")
    assert head.headers["etag"].endswith('-7"')  # 50 MB in the CLI's 8 MB parts
    back = tmp_path / "back.bin"
    _aws(server, "s3", "cp", "s3://cli-big/nested/big.bin", str(back))
    assert back.read_bytes() == big.read_bytes()
    assert not list((server.data_dir / "s3-uploads").iterdir())  # the upload's parts are gone
    full = server.aws("s3", "rb", "s3://cli-big", check=False)
    assert full.returncode != 0 and "BucketNotEmpty" in full.stderr
    _aws(server, "s3", "rm", "--recursive", "s3://cli-big/")
    _aws(server, "s3", "rb", "s3://cli-big")
    assert not (server.data_dir / "s3" / "cli-big").exists()


def test_a_gigabyte_upload_keeps_the_servers_memory_bounded(server: Server) -> None:
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

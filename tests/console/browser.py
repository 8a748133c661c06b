"""A real Chromium for the console's tests: Debian's `chromium` driven by Playwright (never Playwright's own
browser downloads, which this machine cannot reach).

`chromium()` installs the package when it is missing (as root; elsewhere the test is skipped, saying why).
`browser_page()` starts it headless with a fresh profile and every background connection turned off
(without them Chromium's own connections are refused by the closed network), and closes it after.
`sign_in()` signs a page in to the console as a user would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hyperplan.signing import Credentials

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 30_000


def chromium() -> Path:
    """Debian's chromium, installed with apt-get when missing (root only)."""
    if CHROMIUM.exists():
        return CHROMIUM
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("needs Debian's chromium at /usr/bin/chromium: missing, and installing it needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=900, check=True)
        subprocess.run(install, env=env, capture_output=True, timeout=900, check=True)
    return CHROMIUM


@contextmanager
def browser_page(viewport: dict[str, int] | None = None) -> Iterator[Any]:
    """A page of a fresh headless Chromium, closed (with the browser) on the way out."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright")
    executable = chromium()
    with tempfile.TemporaryDirectory(prefix="hp-chromium-") as profile, sync_api.sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            profile,
            executable_path=str(executable),
            headless=True,
            args=FLAGS,
            viewport=viewport or {"width": 1366, "height": 900},
            timezone_id="Europe/Paris",  # a zone that is not UTC: the pages show both
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            context.close()


def sign_in(page: Any, url: str, credentials: Credentials) -> None:
    """Through the sign-in form, as a user would; returns once the console's header offers to sign out."""
    page.goto(f"{url}/console")
    page.get_by_label("Access key ID").fill(credentials.access_key)
    page.get_by_label("Secret access key").fill(credentials.secret_key)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("button", name="Sign out").wait_for()

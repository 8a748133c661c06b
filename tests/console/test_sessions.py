"""Console sessions end: at sign-out (a copy of the cookie, replayed, signs nobody in, on this server and
on another one sharing the store), after the idle timeout, at the end of their lifetime, and with their
key (deactivated: for good). The store keeps only sessions that are still open.

Idleness follows real wall time, never the service clock; here the sessions' wall clock (the service
context's `console_sessions.wall`) is a value the test moves, so that nothing waits.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from hyperplan.console.session import COOKIE
from hyperplan.errors import ValidationError
from hyperplan.services.runtime.console_sessions import (
    DEFAULT_IDLE_TIMEOUT,
    IDLE_TIMEOUT_ENV,
    MAX_PER_KEY,
    idle_timeout_from_env,
)
from hyperplan.signing import Credentials
from hyperplan.store.schema import ConsoleSession
from tests.harness import Server, wait_until
from tests.inprocess import InProcessServer
from tests.postgres import PostgresServer

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
MINUTE = 60.0
HOUR = 3600.0


class Browser:
    """One browser's cookie jar and the CSRF token of its last page, on the server at `url`."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, follow_redirects=False, timeout=60)
        self.token = ""

    def get(self, path: str) -> httpx.Response:
        response = self.http.get(path)
        found = CSRF.search(response.text)
        self.token = found.group(1) if found else self.token
        return response

    def post(self, path: str, data: dict[str, str] | None = None) -> httpx.Response:
        return self.http.post(path, data={**(data or {}), "csrf_token": self.token})

    def sign_in(self, credentials: Credentials) -> None:
        self.get("/console/sign-in")
        response = self.post(
            "/console/sign-in",
            {"access_key_id": credentials.access_key, "secret_access_key": credentials.secret_key},
        )
        assert response.status_code == 303, response.text
        assert self.get("/console/plans").status_code == 200  # and the page's token is kept

    def sign_out(self) -> None:
        assert self.post("/console/sign-out").status_code == 303

    @property
    def cookie(self) -> str:
        return self.http.cookies[COOKIE]

    def close(self) -> None:
        self.http.close()


class Wall:
    """The sessions' wall clock, moved by the test."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def signed_in(url: str, cookie: str, path: str = "/console/plans") -> bool:
    """Whether a request carrying `cookie` (a copy, as an attacker would replay it) gets the page; a
    refusal is the redirect to the sign-in form, never anything else."""
    with httpx.Client(base_url=url, cookies={COOKIE: cookie}, follow_redirects=False) as http:
        response = http.get(path)
    if response.status_code == 200:
        return True
    assert response.status_code == 303, (response.status_code, response.text)
    assert response.headers["location"].startswith("/console/sign-in"), response.headers
    return False


def sign_in(url: str, credentials: Credentials) -> str:
    """A session signed in by a browser that then goes away (its connection closed); its cookie."""
    browser = Browser(url)
    try:
        browser.sign_in(credentials)
        return browser.cookie
    finally:
        browser.close()


def drive_wall(server: InProcessServer) -> Wall:
    assert server.runtime is not None
    wall = Wall()
    server.runtime.context.console_sessions.wall = wall
    return wall


def open_sessions(server: InProcessServer) -> int:
    assert server.runtime is not None
    with server.runtime.context.db.read() as session:
        return int(session.scalar(select(func.count()).select_from(ConsoleSession)) or 0)


def test_a_signed_out_cookie_replayed_signs_nobody_in(fast_shared_server: InProcessServer) -> None:
    server = fast_shared_server
    credentials = server.new_account("leaving")
    browser = Browser(server.url)
    browser.sign_in(credentials)
    copy, token = browser.cookie, browser.token
    assert signed_in(server.url, copy, "/console/training-jobs")
    browser.sign_out()
    for path in ("/console/plans", "/console/training-jobs", "/console/clusters"):
        assert not signed_in(server.url, copy, path)
    with httpx.Client(base_url=server.url, cookies={COOKIE: copy}) as http:
        action = http.post("/console/offerings", data={"csrf_token": token, "target": "training-job"})
        assert action.status_code == 401 and "Your session has ended" in action.text
        form = http.get("/console/sign-in")  # the form, not a redirect to a page that refuses
        assert form.status_code == 200 and 'name="secret_access_key"' in form.text
    browser.sign_in(credentials)  # a new session works; the old one stays ended
    assert signed_in(server.url, browser.cookie)
    assert not signed_in(server.url, copy)
    browser.close()


def test_signing_in_again_ends_the_session_it_replaces(fast_shared_server: InProcessServer) -> None:
    server = fast_shared_server
    credentials = server.new_account("returning")
    browser = Browser(server.url)
    browser.sign_in(credentials)
    first = browser.cookie
    response = browser.post(
        "/console/sign-in",
        {"access_key_id": credentials.access_key, "secret_access_key": credentials.secret_key},
    )
    assert response.status_code == 303 and browser.cookie != first
    assert signed_in(server.url, browser.cookie)
    assert not signed_in(server.url, first)
    browser.close()


def test_a_deactivated_key_ends_its_sessions_for_good(fast_shared_server: InProcessServer) -> None:
    server = fast_shared_server
    credentials = server.new_account("rotating-console")
    server.native(credentials).post("/api/v1/keys")  # a second key: the last active one stays active
    browser = Browser(server.url)
    browser.sign_in(credentials)
    copy = browser.cookie
    server.native().post(f"/api/v1/keys/{credentials.access_key}/deactivate")
    assert not signed_in(server.url, copy)
    server.native().post(f"/api/v1/keys/{credentials.access_key}/activate")
    assert not signed_in(server.url, copy)  # active again, the key signs in anew, not the old session
    browser.sign_in(credentials)
    assert signed_in(server.url, browser.cookie)
    browser.close()


def test_an_idle_session_ends_and_an_active_one_goes_on(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    server = fast_server_factory(data_dir=tmp_path / "data", env={IDLE_TIMEOUT_ENV: "600"}).start()
    wall = drive_wall(server)
    credentials = server.new_account("idler")
    busy, idle = Browser(server.url), Browser(server.url)
    busy.sign_in(credentials)
    idle.sign_in(credentials)
    wall.advance(400)
    assert busy.get("/console/plans").status_code == 200
    wall.advance(400)  # 800 s since the idle session's last request
    assert busy.get("/console/plans").status_code == 200
    assert not signed_in(server.url, idle.cookie)
    assert idle.post("/console/offerings", {"target": "training-job"}).status_code == 401
    wall.advance(400)  # twice the idle timeout since sign-in, never idle for long
    assert busy.get("/console/training-jobs").status_code == 200
    wall.advance(601)
    assert not signed_in(server.url, busy.cookie)
    busy.close()
    idle.close()


def test_an_active_session_still_ends_with_its_lifetime(fast_server: InProcessServer) -> None:
    server = fast_server
    wall = drive_wall(server)
    credentials = server.new_account("marathon")
    browser = Browser(server.url)
    browser.sign_in(credentials)
    for _ in range(14):  # a request every 50 minutes: 11 h 40 min in all
        wall.advance(50 * MINUTE)
        assert browser.get("/console/plans").status_code == 200
    wall.advance(50 * MINUTE)  # 12 h 30 min after sign-in
    assert not signed_in(server.url, browser.cookie)
    browser.close()


def test_the_store_keeps_only_open_sessions_and_a_few_per_key(fast_server: InProcessServer) -> None:
    server = fast_server
    wall = drive_wall(server)
    credentials = server.new_account("many-tabs")
    for _ in range(3):
        sign_in(server.url, credentials)
    assert open_sessions(server) == 3
    wall.advance(DEFAULT_IDLE_TIMEOUT + 1)  # all three idle past their end
    cookies = []
    for _ in range(MAX_PER_KEY + 2):
        cookies.append(sign_in(server.url, credentials))
        wall.advance(1)
    assert open_sessions(server) == MAX_PER_KEY  # the ended three and the two least recent went
    assert not signed_in(server.url, cookies[0])
    assert not signed_in(server.url, cookies[1])
    assert signed_in(server.url, cookies[2])
    assert signed_in(server.url, cookies[-1])


def test_the_idle_timeout_is_a_number_of_seconds_within_a_sessions_lifetime() -> None:
    assert idle_timeout_from_env({}) == DEFAULT_IDLE_TIMEOUT == HOUR
    assert idle_timeout_from_env({IDLE_TIMEOUT_ENV: "900"}) == 900
    for wrong in ("59", "43201", "an hour", "nan", "-600"):
        with pytest.raises(ValidationError, match=IDLE_TIMEOUT_ENV):
            idle_timeout_from_env({IDLE_TIMEOUT_ENV: wrong})


@pytest.mark.postgres
def test_a_sign_out_on_one_server_ends_the_session_on_another(
    server_factory: type[Server], tmp_path: Path, postgres_server: PostgresServer
) -> None:
    url = postgres_server.new_database()
    data_dir = tmp_path / "data"
    first = server_factory(data_dir=data_dir, fleet=SMALL_FLEET, database_url=url).start()
    second = server_factory(data_dir=data_dir, fleet=SMALL_FLEET, database_url=url).start()
    credentials = first.new_account("travelling")
    browser = Browser(first.url)
    browser.sign_in(credentials)
    assert signed_in(second.url, browser.cookie)  # every server honours a session any of them opened
    copy = browser.cookie
    browser.sign_out()
    assert wait_until(lambda: not signed_in(second.url, copy), timeout=60)
    # A key deactivated on one server ends its sessions on the other too.
    first.native(credentials).post("/api/v1/keys")
    browser.sign_in(credentials)
    assert signed_in(second.url, browser.cookie)
    first.native().post(f"/api/v1/keys/{credentials.access_key}/deactivate")
    assert wait_until(lambda: not signed_in(second.url, browser.cookie), timeout=60)
    browser.close()

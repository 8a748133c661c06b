"""Where a store is: its URL checked and shown without its password, and a SQLite store's files."""

from __future__ import annotations

from pathlib import Path

from hyperplan.errors import ValidationError

WRITERS_LOCK_SUFFIX = ".writers-lock"


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'hyperplan.db'}"


def check_url(url: str) -> str:
    """A store's URL as SQLAlchemy takes it: sqlite:///PATH, or postgresql+psycopg://USER@HOST:PORT/DB
    (postgresql:// and postgres:// mean the same: psycopg 3 is the one driver). ValidationError names
    what is wrong, without the URL's password."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValidationError(
            f"database URL {redact(url)!r} has no scheme: give sqlite:///PATH or postgresql://..."
        )
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise ValidationError(
                "a PostgreSQL store needs psycopg 3: pip install 'hyperplan[postgres]'"
            ) from None
        if not rest.partition("?")[0].rpartition("/")[2]:
            raise ValidationError(f"database URL {redact(url)!r} names no database (…/DBNAME)")
        return f"postgresql+psycopg://{rest}"
    if scheme == "sqlite":
        return url
    raise ValidationError(
        f"database URL {redact(url)!r}: {scheme!r} is not a store hyperplan knows; give sqlite:///PATH or "
        "postgresql://USER@HOST:PORT/DBNAME"
    )


def redact(url: str) -> str:
    """The URL with any password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"


def writers_lock_path(url: str) -> str | None:
    """The writers' lock file of a SQLite database on disk: its path with WRITERS_LOCK_SUFFIX."""
    path = url.removeprefix("sqlite:///").partition("?")[0]
    if not path or path == ":memory:" or path.startswith("file:") or url == path:
        return None
    return path + WRITERS_LOCK_SUFFIX

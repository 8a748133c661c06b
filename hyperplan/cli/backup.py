"""`hyperplan backup DEST` and `hyperplan restore SRC`: a data directory's SQLite store, key file and
credentials, copied while the server runs and put back into an empty data directory (store/backup.py).

Like `serve`, they work on a data directory, not through a server; they take their own --data-dir."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from hyperplan.cli.client import default_data_dir
from hyperplan.cli.common import console

DataDir = Annotated[
    Path | None,
    typer.Option(help="Data directory (default: $HYPERPLAN_DATA_DIR or ~/.local/share/hyperplan)."),
]
KeyFile = Annotated[
    Path | None,
    typer.Option(
        envvar="HYPERPLAN_KEY_FILE",
        help="The master key file, if the server names one outside the data directory (--key-file).",
    ),
]


def backup(
    dest: Annotated[Path, typer.Argument(help="A new (or empty) directory to write the backup to.")],
    data_dir: DataDir = None,
    key_file: KeyFile = None,
) -> None:
    """Copy a data directory's store, master key and credentials while its server runs (SQLite stores;
    a PostgreSQL store is backed up with pg_dump, docs/POSTGRES.md)."""
    from hyperplan.cli.serve_options import refusals_exit
    from hyperplan.store.backup import backup as take

    os.umask(0o077)
    directory = (data_dir or default_data_dir()).expanduser()
    with refusals_exit():  # as `serve` says them: one line, exit code 2
        made = take(directory, dest.expanduser(), key_file.expanduser() if key_file else None)
    console.print(
        f"Backed up {directory} to {made.directory} ({', '.join(made.files)}), as of "
        f"{made.taken_at:%Y-%m-%d %H:%M:%S} UTC. It holds the master key: keep it as safe as the server.",
        highlight=False,
        markup=False,
    )


def restore(
    src: Annotated[Path, typer.Argument(help="A directory `hyperplan backup` wrote.")],
    data_dir: DataDir = None,
    key_file: KeyFile = None,
) -> None:
    """Put a backup into an empty (or new) data directory; then start `hyperplan serve` on it."""
    from hyperplan.cli.serve_options import refusals_exit
    from hyperplan.store.backup import restore as put_back

    os.umask(0o077)
    directory = (data_dir or default_data_dir()).expanduser()
    with refusals_exit():
        made = put_back(src.expanduser(), directory, key_file.expanduser() if key_file else None)
    console.print(
        f"Restored the backup of {made.taken_at:%Y-%m-%d %H:%M:%S} UTC into {directory}: start "
        f"`hyperplan serve --data-dir {directory}`.",
        highlight=False,
        markup=False,
    )

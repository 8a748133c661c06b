"""Python images built offline from Debian's packages, and pushed:
``image-dev build REGISTRY [--name N] [--packages P,...] [--sagemaker] [--authfile FILE] [--cache DIR]
[--store DIR]``.

``build`` installs ``podman``, ``runc`` and ``mmdebstrap`` when they are missing (apt-get, as root), takes
the root file system of Debian's ``python3`` (Python and its standard library) and the packages asked for
from the cache (``--cache``; building it with mmdebstrap if it is not there, rootfs.py), imports it into a
Podman store of its own (``--store``, podman.py) as ``localhost/hyperplan-rootfs:KEY``, once per store,
tags it and pushes it to REGISTRY, and prints ``REFERENCE DIGEST``, one line. The reference is
``REGISTRY/hyperplan/python:3`` by default; with ``--sagemaker`` it is
``REGISTRY/hyperplan/sagemaker-python:3``, the same root file system (the same cached tarball, the same
imported layer) with one more layer, ``/usr/local/bin/train`` (sagemaker_train.py), added by ``podman
build`` with a COPY: no network, about a second.

A registry on loopback (127.0.0.1, localhost, [::1]) is spoken to over plain HTTP, as
``scripts/registry-dev`` serves it; any other over TLS unless ``--plain-http``. A registry that wants a
login (``registry-dev up --login``) is pushed to with the auth file ``--authfile`` names, as ``podman
login --authfile FILE`` writes it; without one, with Podman's own (``podman login``,
``REGISTRY_AUTH_FILE``). No password is ever an argument here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from hyperplan.containers.host_tools import Refused, ensure_packages, locked
from hyperplan.containers.podman import PodmanStore
from hyperplan.containers.rootfs import Rootfs, cached_rootfs, package_list

# catatonit: Podman's init and pods' pause process, only recommended by Debian's podman (runtime podman
# needs it: backends/runtime_choice.py).
PACKAGES = {"podman": "podman", "runc": "runc", "catatonit": "catatonit", "mmdebstrap": "mmdebstrap"}
PYTHON_NAME = "hyperplan/python:3"
SAGEMAKER_NAME = "hyperplan/sagemaker-python:3"
TRAIN_PROGRAM = Path(__file__).parent / "sagemaker_train.py"
DEFAULT_CACHE = Path("/var/cache/hyperplan/image-dev")
DEFAULT_STORE = Path("/var/lib/hyperplan/image-dev/podman")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# What `podman import` gives the image besides its files: Debian's PATH, and Python when run bare.
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    'CMD ["python3"]',
)
REGISTRY = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\])(?::[0-9]{1,5})?")
NAME = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="image-dev", description="Python images built offline, and pushed.")
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser("build", help="build an image and push it to REGISTRY")
    build_command.add_argument(
        "registry", metavar="REGISTRY", help="HOST:PORT, e.g. what registry-dev printed"
    )
    defaults = f"default {PYTHON_NAME}, or {SAGEMAKER_NAME} with --sagemaker"
    build_command.add_argument("--name", help=f"the image's name and tag ({defaults})")
    build_command.add_argument("--packages", default="", help="more Debian packages, comma-separated")
    build_command.add_argument("--sagemaker", action="store_true", help="add /usr/local/bin/train")
    build_command.add_argument("--plain-http", action="store_true", help="no TLS, even off loopback")
    build_command.add_argument(
        "--authfile", type=Path, help="the registry's login, as `podman login --authfile FILE` wrote it"
    )
    build_command.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="where root file systems are kept"
    )
    build_command.add_argument(
        "--store", type=Path, default=DEFAULT_STORE, help="the Podman store that builds"
    )
    arguments = parser.parse_args(argv)
    try:
        reference, digest = build(
            arguments.registry,
            name=arguments.name or (SAGEMAKER_NAME if arguments.sagemaker else PYTHON_NAME),
            packages=arguments.packages.split(","),
            sagemaker=arguments.sagemaker,
            plain_http=arguments.plain_http or registry_host(arguments.registry) in LOOPBACK_HOSTS,
            cache=arguments.cache.absolute(),
            store_dir=arguments.store.absolute(),
            authfile=None if arguments.authfile is None else arguments.authfile.absolute(),
        )
    except Refused as refusal:
        print(f"image-dev {arguments.command}: {refusal}", file=sys.stderr)
        return 1
    print(f"{reference} {digest}")
    return 0


def registry_host(registry: str) -> str:
    """``HOST`` of ``HOST:PORT`` (``[::1]`` of ``[::1]:5000``)."""
    if registry.startswith("["):
        return registry.partition("]")[0] + "]"
    return registry.partition(":")[0]


def build(
    registry: str,
    *,
    name: str,
    packages: list[str],
    sagemaker: bool,
    plain_http: bool,
    cache: Path,
    store_dir: Path,
    authfile: Path | None = None,
) -> tuple[str, str]:
    """Build and push; the pushed reference and its manifest's digest."""
    if not REGISTRY.fullmatch(registry):
        raise Refused(f"REGISTRY {registry!r}: expected HOST or HOST:PORT, such as 127.0.0.1:5000")
    if not NAME.fullmatch(name):
        raise Refused(f"--name {name!r}: expected a lower-case repository and a tag, such as {PYTHON_NAME}")
    if os.geteuid() != 0:
        raise Refused(
            "image-dev build must run as root (mmdebstrap makes device files; Podman's store is root's)"
        )
    wanted = package_list(packages)
    install()
    rootfs = cached_rootfs(cache, wanted)
    where = "from the cache" if rootfs.built_seconds is None else f"built in {rootfs.built_seconds:.0f} s"
    print(f"image-dev: root file system {rootfs.tarball} ({', '.join(wanted)}), {where}", file=sys.stderr)
    store = PodmanStore(store_dir)
    reference = f"{registry}/{name}"
    with locked(store_dir / ".lock"):
        store.prepare()
        base = _import(store, rootfs)
        if sagemaker:
            _add_train(store, base, reference)
        else:
            store.run("tag", base, reference)
        return reference, _push(store, reference, plain_http, authfile)


def install() -> None:
    """apt-get install podman, runc, catatonit and mmdebstrap where one is missing."""
    ensure_packages(PACKAGES)


def _import(store: PodmanStore, rootfs: Rootfs) -> str:
    """The root file system as an image of the store, imported once."""
    base = f"localhost/hyperplan-rootfs:{rootfs.key}"
    if not store.has_image(base):
        changes = [argument for change in IMAGE_CHANGES for argument in ("--change", change)]
        store.run("import", "--quiet", *changes, str(rootfs.tarball), base)
    return base


def _add_train(store: PodmanStore, base: str, reference: str) -> None:
    with tempfile.TemporaryDirectory(dir=store.root, prefix="context-") as context:
        train = Path(context) / "train"
        shutil.copyfile(TRAIN_PROGRAM, train)
        train.chmod(0o755)  # COPY keeps the mode
        (Path(context) / "Containerfile").write_text(f"FROM {base}\nCOPY train /usr/local/bin/train\n")
        store.run("build", "--quiet", "--network=none", "--pull=never", "--tag", reference, context)


def _push(store: PodmanStore, reference: str, plain_http: bool, authfile: Path | None) -> str:
    with tempfile.TemporaryDirectory(dir=store.root, prefix="push-") as scratch:
        digest_file = Path(scratch) / "digest"
        tls = ["--tls-verify=false"] if plain_http else []
        auth = ["--authfile", str(authfile)] if authfile is not None else []
        store.run("push", "--quiet", *tls, *auth, "--digestfile", str(digest_file), reference)
        return digest_file.read_text().strip()

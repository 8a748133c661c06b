"""The pure parts of the container tools (hyperplan/containers): the host's apt sources as mmdebstrap gets
them, the package list and its cache key, and the Podman configuration written for this host's limits.
tests/containers runs the tools themselves (root only)."""

from __future__ import annotations

import resource
import tomllib
from pathlib import Path

import pytest

from hyperplan.containers.host_tools import Refused
from hyperplan.containers.image_build import registry_host
from hyperplan.containers.podman import containers_conf, storage_conf, ulimits
from hyperplan.containers.rootfs import package_list, parse_deb822, parse_one_line, rootfs_key

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://security.example.org/debian-security
Suites: bookworm-security
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBF...
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main

Types: deb
Enabled: no
URIs: http://old.example.org/debian
Suites: bookworm
Components: main

Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
"""

ONE_LINE = """\
# the mirror
deb [arch=amd64 signed-by=/etc/apt/keyrings/mirror.gpg] http://mirror.example.org/debian bookworm main
deb http://mirror.example.org/debian bookworm-backports main non-free-firmware # a comment
deb-src http://mirror.example.org/debian bookworm main
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
deb file:///srv/mirror bookworm main
deb http://mirror.example.org/debian trixie main
"""


def test_the_host_s_sources_for_bookworm_become_mmdebstrap_s_one_line_entries() -> None:
    served = [source.line() for source in parse_deb822(DEB822) if source.serves("bookworm")]
    assert served == [
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian"
        " bookworm main contrib",
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian"
        " bookworm-updates main contrib",
        # a key written into the file is not a path mmdebstrap can name: apt's trusted keys apply
        "deb http://security.example.org/debian-security bookworm-security main",
    ]
    served = [source.line() for source in parse_one_line(ONE_LINE) if source.serves("bookworm")]
    assert served == [
        "deb [signed-by=/etc/apt/keyrings/mirror.gpg] http://mirror.example.org/debian bookworm main",
        "deb http://mirror.example.org/debian bookworm-backports main non-free-firmware",
    ]


def test_the_package_list_always_holds_python_and_its_key_ignores_order_and_repeats() -> None:
    assert package_list([""]) == ("python3",)
    assert package_list(["python3-numpy", " ca-certificates", "python3-numpy", "python3"]) == (
        "ca-certificates",
        "python3",
        "python3-numpy",
    )
    assert rootfs_key(package_list(["b1", "a1"])) == rootfs_key(package_list(["a1", "b1", "a1"]))
    assert rootfs_key(package_list(["a1"])) != rootfs_key(package_list(["a1", "b1"]))
    assert rootfs_key(package_list([])) != rootfs_key(package_list([]), suite="trixie")
    with pytest.raises(Refused, match="not a Debian package name: --hook=x, Python3"):
        package_list(["Python3", "--hook=x"])


def test_containers_get_podman_s_ulimits_within_the_host_s_hard_limits() -> None:
    assert ulimits(20_000, 96_553) == ["nofile=20000:20000", "nproc=32768:32768"]
    assert ulimits(resource.RLIM_INFINITY, resource.RLIM_INFINITY) == [
        "nofile=1048576:1048576",
        "nproc=32768:32768",
    ]
    assert ulimits(1024, 512) == ["nofile=1024:1024", "nproc=512:512"]


def test_the_podman_configuration_is_toml_that_keeps_the_store_to_itself(tmp_path: Path) -> None:
    odd = tmp_path / 'a "quoted" dir'
    engine = tomllib.loads(containers_conf("runc", ["nofile=1024:1024"], odd / "tmp"))
    assert engine == {
        "containers": {"default_ulimits": ["nofile=1024:1024"]},
        "engine": {
            "runtime": "runc",
            "tmp_dir": str(odd / "tmp"),
            "lock_type": "file",
            "events_logger": "file",
        },
    }
    storage = tomllib.loads(storage_conf(odd / "storage", odd / "run"))
    assert storage == {
        "storage": {"driver": "overlay", "graphroot": str(odd / "storage"), "runroot": str(odd / "run")}
    }


def test_the_registry_host_is_what_decides_plain_http() -> None:
    assert registry_host("127.0.0.1:5000") == "127.0.0.1"
    assert registry_host("localhost") == "localhost"
    assert registry_host("[::1]:5000") == "[::1]"
    assert registry_host("registry.example.com:443") == "registry.example.com"

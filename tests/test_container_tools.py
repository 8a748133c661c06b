"""The pure parts of the container tools (hyperplan/containers): the host's apt sources as mmdebstrap gets
them, the package list and its cache key, the Podman configuration written for this host's limits, and the
dev registry's login (its bcrypt file, its configuration, an `up` that asks for another). tests/containers
runs the tools themselves (root only)."""

from __future__ import annotations

import io
import json
import resource
import tomllib
from pathlib import Path

import pytest

from hyperplan.containers import htpasswd, registry_dev
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


def test_the_registry_s_login_file_holds_a_bcrypt_hash_that_matches_its_password_alone() -> None:
    entry = htpasswd.line("puller", "pull-secret")
    username, hashed = entry.removesuffix("\n").split(":", 1)
    assert username == "puller" and entry.endswith("\n")
    assert hashed.startswith("$2b$05$") and len(hashed) == 60  # what the registry's Go bcrypt reads
    assert htpasswd.matches("pull-secret", hashed)
    assert not htpasswd.matches("pull-secreT", hashed) and not htpasswd.matches("", hashed)
    assert not htpasswd.matches("pull-secret", "pull-secret")  # not a hash: never equal to itself
    assert htpasswd.bcrypt("pull-secret") != hashed  # a fresh salt each time
    assert htpasswd.parse(entry + "\nother:$2b$05$x\n") == {"puller": hashed, "other": "$2b$05$x"}


@pytest.mark.parametrize(
    ("username", "password", "said"),
    [
        ("", "p", "a user name is one word"),
        ("a:b", "p", "a user name is one word without ':'"),
        ("a b", "p", "a user name is one word"),
        ("puller", "", "the password is empty"),
        ("puller", "x" * 73, "longer than 72 bytes"),
        ("puller", "é" * 37, "longer than 72 bytes"),  # bytes, not characters
        ("puller", "two\nlines", "one line"),
    ],
)
def test_a_login_the_file_cannot_hold_or_bcrypt_would_cut_is_refused(
    username: str, password: str, said: str
) -> None:
    with pytest.raises(Refused, match=said):
        htpasswd.line(username, password)
    htpasswd.check_login("puller", "x" * 72)  # 72 bytes: all of it counts


def test_the_registry_s_configuration_asks_for_the_login_of_its_file_only_when_told(tmp_path: Path) -> None:
    layout = registry_dev.Layout(tmp_path / 'a "quoted" dir')
    open_one = registry_dev.config_yaml(layout, 5000)
    assert "auth:" not in open_one and "no authentication" in open_one
    with_login = registry_dev.config_yaml(layout, 5000, login=True)
    assert (
        with_login.splitlines()[0]
        == "# Written by registry-dev up: plain HTTP, a login (htpasswd), loopback only."
    )
    auth = with_login[with_login.index("auth:") :].splitlines()
    assert auth == [
        "auth:",
        "  htpasswd:",
        '    realm: "registry-dev"',
        f"    path: {json.dumps(str(layout.htpasswd))}",  # a JSON string is YAML's double-quoted one
    ]


def test_an_up_of_a_registry_up_with_another_login_or_none_is_refused(tmp_path: Path) -> None:
    layout = registry_dev.Layout(tmp_path)
    refuse = registry_dev.refuse_another_login
    refuse(layout, None)  # up without a login, and none asked for
    with pytest.raises(Refused, match="is up without a login, and this up asks for puller's"):
        refuse(layout, registry_dev.Login("puller", "pw"))
    layout.htpasswd.write_text(htpasswd.line("puller", "pw"))
    refuse(layout, registry_dev.Login("puller", "pw"))  # the same login: the registry is left as it is
    for login, asked in (
        (None, "none"),
        (registry_dev.Login("pusher", "pw"), "pusher's"),
        (registry_dev.Login("puller", "other"), "puller's with another password"),
    ):
        with pytest.raises(Refused, match=f"is up asking for puller's login, and this up asks for {asked}:"):
            refuse(layout, login)


def test_the_password_is_one_line_of_standard_input_and_login_goes_with_up_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("pass word\r\nnext line\n"))
    assert registry_dev.read_password("puller") == "pass word"
    with pytest.raises(SystemExit) as exited:
        registry_dev.main(["status", str(tmp_path), "--login", "puller"])
    assert exited.value.code == 2 and "--login goes with up, not status" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert registry_dev.main(["up", str(tmp_path / "registry"), "--login", "puller"]) == 1
    assert "the password is empty" in capsys.readouterr().err
    assert not (tmp_path / "registry").exists()  # refused before anything was written or started

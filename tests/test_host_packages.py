"""Debian's packages for the dev tools (hyperplan/host_packages.py): what dpkg lists as missing, and each
refusal of ``ensure``, tried for real (no package is installed here: the ones asked for exist nowhere or
are installed already). The refusal by apt-get needs root and reaches Debian's mirror (apt-get update)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys

import pytest

from hyperplan.host_packages import PackagesRefused, ensure, missing

NO_SUCH_PACKAGE = "hyperplan-no-such-package"

pytestmark = pytest.mark.skipif(not shutil.which("dpkg-query"), reason="a Debian host: dpkg lists packages")


def test_missing_names_what_dpkg_does_not_list_as_installed_in_the_order_given() -> None:
    assert missing(["dpkg", NO_SUCH_PACKAGE, "coreutils", f"{NO_SUCH_PACKAGE}-2"]) == [
        NO_SUCH_PACKAGE,
        f"{NO_SUCH_PACKAGE}-2",
    ]
    assert missing(["dpkg", "coreutils"]) == []


# Run as a user other than root (as root, the child drops to nobody once it has imported the module: the
# interpreter and the checkout need not be readable by nobody). The installed packages are no reason to
# refuse; the missing one is, and only it is named.
AS_ANOTHER_USER = f"""
import os, sys
from hyperplan.host_packages import PackagesRefused, ensure
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(int(sys.argv[2]))
    os.setuid(int(sys.argv[1]))
ensure(["dpkg", "coreutils"], why="a test")
try:
    ensure(["dpkg", "{NO_SUCH_PACKAGE}"], why="a test of the refusal")
except PackagesRefused as refusal:
    print(f"uid {{os.geteuid()}}: {{refusal}}")
else:
    print("installed")
"""


def test_without_root_ensure_passes_what_is_installed_and_refuses_the_rest_saying_it_needs_root() -> None:
    user = pwd.getpwuid(os.geteuid())
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("as root, the test runs as the user nobody, and this host has none")
    said = subprocess.run(
        [sys.executable, "-c", AS_ANOTHER_USER, str(user.pw_uid), str(user.pw_gid)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert said.returncode == 0, said.stderr
    refusal = said.stdout.strip()
    assert refusal.startswith(f"uid {user.pw_uid}: {NO_SUCH_PACKAGE} not installed (a test of the refusal)")
    assert "needs root" in refusal
    assert f"apt-get install {NO_SUCH_PACKAGE}" in refusal
    assert "dpkg " not in refusal


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: apt-get install runs as root only")
def test_a_package_apt_get_cannot_find_is_refused_with_apt_get_s_own_words() -> None:
    with pytest.raises(PackagesRefused) as refused:
        ensure([NO_SUCH_PACKAGE], why="a test of apt-get's refusal")
    said = str(refused.value)
    assert said.startswith(f"could not install {NO_SUCH_PACKAGE} (a test of apt-get's refusal) with apt-get:")
    assert f"E: Unable to locate package {NO_SUCH_PACKAGE}" in said.splitlines()
    assert missing([NO_SUCH_PACKAGE]) == [NO_SUCH_PACKAGE]

"""A shared library that says who loaded it: the isolation tests hand it to tenant work through
``LD_PRELOAD``, ``LD_LIBRARY_PATH`` and ``GCONV_PATH`` and then read who ran it.

Its constructor appends one line per process that loads it to a file fixed at build time (never read
from the environment, which is what is under test): ``uid=U euid=E exe=PATH``. A line with uid or euid 0
means the tenant's variables reached a process running as root. Built with the machine's C compiler
(gcc is on every machine of this project's kind); a test without one skips saying so.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE = r"""
#include <stdio.h>
#include <unistd.h>
#include <fcntl.h>
#include <string.h>

__attribute__((constructor)) static void hyperplan_uid_probe(void) {
    char exe[512] = "?";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    char line[700];
    int len = snprintf(line, sizeof line, "uid=%d euid=%d exe=%s\n", (int)getuid(), (int)geteuid(), exe);
    int fd = open(RECORD, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0) {
        if (write(fd, line, len) < 0) {}
        close(fd);
    }
}
"""

# GCONV_PATH names a directory of iconv modules: one that lists a module built from the same source is
# loaded by any program converting to that charset (the classic set-uid escalation). The probe's
# gconv-modules names it, so iconv_open("PROBE") in a process honouring GCONV_PATH loads it.
GCONV_MODULES = "module  PROBE//  INTERNAL  uid_probe  1\nmodule  INTERNAL  PROBE//  uid_probe  1\n"


@dataclass(frozen=True)
class Probe:
    directory: Path
    library: Path
    record: Path

    def environment(self) -> dict[str, str]:
        """What a tenant would set to get its library loaded by whatever runs its program."""
        return {
            "LD_PRELOAD": str(self.library),
            "LD_LIBRARY_PATH": str(self.directory),
            "GCONV_PATH": str(self.directory),
        }

    def lines(self) -> list[str]:
        try:
            return self.record.read_text().splitlines()
        except FileNotFoundError:
            return []

    def uids(self) -> set[int]:
        """Every real and effective uid a process that loaded the library had."""
        found: set[int] = set()
        for line in self.lines():
            fields = dict(word.split("=", 1) for word in line.split(" ") if "=" in word)
            found.add(int(fields["uid"]))
            found.add(int(fields["euid"]))
        return found


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def build(directory: Path) -> Probe:
    """Build the probe in ``directory`` (made 0755, so every user can load it); its record file is made
    0666 there, so that every process that loads it, root or not, can append."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) on this machine")
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    record = directory / "loaded-by.txt"
    record.touch()
    record.chmod(0o666)
    source = directory / "uid_probe.c"
    source.write_text(SOURCE)
    library = directory / "uid_probe.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", f'-DRECORD="{record}"', "-o", str(library), str(source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    library.chmod(0o755)
    (directory / "gconv-modules").write_text(GCONV_MODULES)
    return Probe(directory, library, record)

"""The client options in front of the command reach a real answer, as they do after it."""

from __future__ import annotations

import json

from tests.cli.support import closed_port
from tests.inprocess import InProcessServer


def test_json_before_or_after_the_command_prints_the_same_answer(fast_server: InProcessServer) -> None:
    after = json.loads(fast_server.cli("accounts", "list", "--json").stdout)
    before = json.loads(fast_server.cli("--json", "accounts", "list").stdout)
    assert before == after
    assert [a["Name"] for a in after]  # the administrator's account at least


def test_the_endpoint_before_the_command_is_the_one_used(fast_server: InProcessServer) -> None:
    # The harness points HYPERPLAN_ENDPOINT_URL at the server; a flag naming it again must be accepted in
    # front of the command, and one after the command must win over it.
    shown = fast_server.cli("--endpoint-url", fast_server.url, "clock", "show", "--json").stdout
    assert json.loads(shown)["Kind"] == "manual"
    nobody = f"http://127.0.0.1:{closed_port()}"
    refused = fast_server.cli(
        "--endpoint-url", fast_server.url, "clock", "show", "--endpoint-url", nobody, check=False
    )
    assert refused.returncode == 1 and f"at {nobody}:" in refused.stderr

"""botocore's models, as a server loads them: once per process, before its first request."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from botocore.model import ServiceModel

from hyperplan.wire import model
from tests.inprocess import InProcessServer

ASKERS = 8


def test_threads_asking_together_for_a_model_share_one_load() -> None:
    """A new server's first requests arrive together, each in a thread of the pool: they wait for one
    load of the model (a hundred ms of CPU or more), rather than each loading a copy of its own."""
    model._loaded.pop(model.LOGS, None)  # as in a process that has not loaded it yet
    together = threading.Barrier(ASKERS)

    def ask(_: int) -> ServiceModel:
        together.wait()
        return model.service_model(model.LOGS)

    with ThreadPoolExecutor(ASKERS) as pool:
        found = list(pool.map(ask, range(ASKERS)))
    assert all(each is found[0] for each in found)
    assert found[0].service_name == model.LOGS


def test_a_server_has_every_model_loaded_before_its_first_request(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    for service in model.SERVICES:
        model._loaded.pop(service, None)
    server = fast_server_factory(data_dir=tmp_path / "data").start()
    try:
        assert set(model._loaded) == model.SERVICES  # no request has been made
    finally:
        server.close()

"""The composition root: building does no I/O, start steps are explicit, the back end is injected."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperplan.app import AppConfig, Application, BackendFactory, event_handlers, local_backend
from hyperplan.backends.fake import FakeBackend, FakeWorld
from hyperplan.core import reclaim_warnings
from hyperplan.errors import StartRefused
from hyperplan.services.clusters import metering
from hyperplan.services.jobs import job_clocks, spot
from hyperplan.services.orchestration import demo_load
from hyperplan.services.plans import lifecycle, resale
from tests.harness import SERVER_START, unisolated

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"


def _config(data_dir: Path, backend: BackendFactory = local_backend) -> AppConfig:
    return AppConfig(
        data_dir=data_dir,
        fleet_path=SMALL_FLEET,
        clock="manual",
        clock_start=SERVER_START,
        backend=backend,
        **unisolated(data_dir),
    )


def test_building_an_application_touches_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "new"
    application = Application(_config(data_dir))
    assert not data_dir.exists()
    with pytest.raises(RuntimeError, match="not open"):
        application.context  # noqa: B018


def test_open_migrates_and_bootstrap_creates_the_administrator_once(tmp_path: Path) -> None:
    first = Application(_config(tmp_path))
    context = first.open()
    assert (tmp_path / "hyperplan.db").exists()
    assert not first.credentials_path.exists()  # opening is not bootstrapping
    assert context.clock.now() == SERVER_START
    assert first.bootstrap()
    assert first.credentials_path.exists()
    first.stop()

    second = Application(_config(tmp_path))
    assert not second.bootstrap()  # the store has its administrator already
    second.stop()


def test_the_back_end_is_the_one_the_configuration_builds(tmp_path: Path) -> None:
    world = FakeWorld()
    built: list[Path] = []

    def fake(work_dir: Path) -> FakeBackend:
        built.append(work_dir)
        return FakeBackend(world)

    application = Application(_config(tmp_path, backend=fake))
    assert built == []  # built when the application opens, not before
    context = application.open()
    assert isinstance(context.backend, FakeBackend) and built == [context.work_dir]  # not the data directory
    assert context.work_dir != tmp_path
    application.stop()


def test_every_service_timed_event_has_exactly_one_handler(tmp_path: Path) -> None:
    application = Application(_config(tmp_path))
    handlers = event_handlers(application.open())
    kinds = {
        lifecycle.SEGMENT_START,
        lifecycle.SEGMENT_RECLAIM,
        lifecycle.SEGMENT_END,
        lifecycle.START_REMINDER,
        lifecycle.RECLAIM_REMINDER,
        lifecycle.PAYMENT_DEADLINE,
        demo_load.TOP_UP,
        job_clocks.PENDING_LIMIT,
        job_clocks.MAX_RUNTIME,
        job_clocks.AUTO_BOOK,
        job_clocks.SPOT_MAX_WAIT,
        spot.STOP_LENDING,
        resale.CREDIT_EVENT,
        reclaim_warnings.RECLAIM_WARNING,
        metering.METER_EVENT,
    }
    assert set(handlers) == kinds
    assert application.workers.events.handlers.keys() == kinds
    application.stop()


def test_the_slurm_back_end_refuses_isolation_none(tmp_path: Path) -> None:
    """The Slurm back end runs every account's work as the account's OS user (its reservations are made
    for that user alone): mode none is refused at open, before anything is written."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        'region = "us-west-2"\n[backend]\nkind = "slurm"\nslurm_conf = "/etc/slurm/slurm.conf"\n'
        '[[zones]]\nname = "us-west-2a"\nzone_id = "usw2-az1"\n'
        '[[pools]]\ninstance_type = "ml.p5.48xlarge"\nzone = "us-west-2a"\nnodes = "gpu[1-2]"\n'
        'price_per_instance_hour = "55.04"\n'
    )
    data_dir = tmp_path / "data"
    config = AppConfig(
        data_dir=data_dir, fleet_path=fleet, clock="manual", clock_start=SERVER_START, **unisolated(data_dir)
    )
    with pytest.raises(StartRefused, match="isolation mode 'none' is refused"):
        Application(config).open()
    assert not (data_dir / "hyperplan.db").exists()

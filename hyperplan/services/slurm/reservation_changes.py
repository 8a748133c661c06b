"""A desired reservation brought about in Slurm (a pass of slurm_reservations): made, or corrected
where it differs (nodes, users, start, end), each read back; what changed, as notes for the plan's
history.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Literal

from hyperplan.clock import utcnow
from hyperplan.core.hostlist import compress
from hyperplan.services.slurm.desired_reservations import Desired, has_started, same_nodes
from hyperplan.services.slurm.job_time_limits import PassQueue, follow_end
from hyperplan.services.slurm.reservation_notes import Note
from hyperplan.slurm.client import SlurmClient, SlurmError
from hyperplan.slurm.parse import Node, Reservation

log = logging.getLogger(__name__)

# Under a manual or accelerated clock a reservation's real end follows the service time left; it is
# moved only when it is this far from where it should be (real time passes while a manual clock stands).
_DRIFT = timedelta(minutes=15)


def correct(
    client: SlurmClient,
    want: Desired,
    have: Reservation,
    nodes: tuple[str, ...],
    replaced: tuple[tuple[str, str], ...],
    health: dict[str, Node],
    real_now: datetime,
    queue: PassQueue | None = None,
) -> list[Note]:
    """`queue`: the pass's Slurm queue, read once for every reservation whose end moves."""
    changes: dict[str, object] = {}
    said = []
    if not same_nodes(have.nodes, nodes):
        changes["nodes"] = nodes
        said.append(f"nodes {compress(have.nodes)} -> {compress(nodes)}")
    if set(have.users) != set(want.users):
        changes["users"] = list(want.users)
        # Borrowers admitted and let go (spot lending) are no correction, and the owner's history never
        # names another account: only an owner's user found missing is said.
        if want.user not in have.users:
            said.append(f"users {','.join(have.users) or 'none'} -> {want.user}")
    started = has_started(have, real_now)
    if want.start is not None and not want.early and not started and have.start != want.start:
        changes["start"] = want.start
        said.append(f"start {_at(have.start)} -> {_at(want.start)}")
    elif want.start is None and have.start > real_now:  # made early; its segment has started meanwhile
        changes["start"] = "now"
        said.append(f"start {_at(have.start)} -> now")
    if _end_differs(want, have):
        changes["end"] = want.end
        said.append(f"end {_at(have.end)} -> {_at(want.end)}")
    if not changes:
        return []
    try:
        got = client.update_reservation(want.name, **changes)  # type: ignore[arg-type]
    except SlurmError as error:
        log.warning("could not correct Slurm reservation %s: %s", want.name, error.detail)
        return []
    _check_read_back(want, got, nodes)
    notes = follow_end(client, want, have.end, got.end, queue) if "end" in changes else []
    for failed, new in replaced:
        node = health.get(failed)
        why = f"{node.state} ({node.reason})" if node is not None and node.reason else "unhealthy"
        notes.append(
            Note(
                want.plan_id,
                "slurm-node-replaced",
                f"Node {failed} of {want.plan_name}-rc{want.ordinal} is {why}: replaced by {new} "
                f"in Slurm reservation {want.name}.",
                failed,
                why,
            )
        )
    if said and (len(changes) > 1 or not replaced):  # more than the replacements said
        notes.append(
            Note(
                want.plan_id,
                "slurm-reservation-corrected",
                f"Slurm reservation {want.name} corrected: {'; '.join(said)}.",
            )
        )
    return notes


def _end_differs(want: Desired, have: Reservation) -> bool:
    if want.start is not None and not want.early:  # the wall clock: the real end
        return have.end != want.end.replace(microsecond=0)
    if want.ending and have.end > want.end:
        return True
    return abs(have.end - want.end) > _DRIFT


def create(
    client: SlurmClient,
    want: Desired,
    nodes: tuple[str, ...],
    made_before: bool,
    moved: Iterable[str],
) -> list[Note]:
    real_now = utcnow()
    start: datetime | Literal["now"] = (
        "now" if want.start is None or want.start <= real_now else want.start.replace(microsecond=0)
    )
    # On nodes where on-demand work may still run (without a time limit, or one past the start): Slurm
    # would refuse ("Requested nodes are busy"). This pass cuts that work's limit, or ends it when the
    # reservation is near (slurm_on_demand); meanwhile nothing new lands there that would run into it.
    flags = ("IGNORE_JOBS",)
    try:
        got = client.create_reservation(
            want.name,
            users=list(want.users),
            nodes=nodes,
            start=start,
            end=want.end.replace(microsecond=0),
            flags=flags,
        )
    except SlurmError as error:
        log.warning("could not make Slurm reservation %s: %s", want.name, error.detail)
        return []
    _check_read_back(want, got, nodes)
    where = f"on {compress(got.nodes)} for {want.user} from {_at(got.start)} to {_at(got.end)} UTC"  # owner
    if want.name in moved:
        kind, message = "slurm-reservation-moved", f"Slurm reservation {want.name} moved: now {where}."
    elif made_before:
        kind = "slurm-reservation-recreated"
        message = f"Slurm reservation {want.name} was missing; made again {where}."
    else:
        kind, message = "slurm-reservation-made", f"Slurm reservation {want.name} made {where}."
    return [Note(want.plan_id, kind, message)]


def _check_read_back(want: Desired, got: Reservation, nodes: tuple[str, ...]) -> None:
    """Slurm said yes: make sure it holds what was asked (nodes, user, times; its NodeCnt shrinks
    silently, so we never use it, but say so loudly if anything ever differs). The next pass corrects
    what it can."""
    wrong = []
    if not same_nodes(got.nodes, nodes):
        wrong.append(f"nodes {compress(got.nodes) if got.nodes else 'none'}, not {compress(nodes)}")
    if set(got.users) != set(want.users):
        wrong.append(f"users {','.join(got.users) or 'none'}, not {','.join(want.users)}")
    if want.start is not None and not want.early and want.start > utcnow() and got.start != want.start:
        wrong.append(f"start {_at(got.start)}, not {_at(want.start)}")
    if _end_differs(want, got):
        wrong.append(f"end {_at(got.end)}, not {_at(want.end)}")
    if wrong:
        log.error("Slurm reservation %s differs from what was asked: %s", want.name, "; ".join(wrong))


def _at(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}"

"""One status mechanism for every entity that has a status, as data.

A :class:`Lifecycle` is a StrEnum of states, the state every entity of its kind starts in, and a
transition table: the moves each state may make. A state with no moves is final. :meth:`Lifecycle.check`
is the one test of a move; a move the table does not list is a bug and raises :class:`IllegalTransition`
(staying in the same state is not a move either). `hyperplan.services.runtime.status.change` is the one place
a stored status changes: it checks the move here and records it.

The lifecycles of plans and training jobs live beside their rules (`hyperplan.core.lifecycle`,
`hyperplan.core.jobs`); those of the entities whose statuses have no other rules are below.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

S = TypeVar("S", bound=StrEnum)


class IllegalTransition(RuntimeError):
    """A move the entity's transition table does not allow: a bug, never an answer to a caller (so it is
    not a `hyperplan.errors.HyperplanError`; the server logs it and answers InternalFailure)."""


@dataclass(frozen=True)
class Lifecycle(Generic[S]):
    kind: str  # the entity kind recorded with each change, e.g. "cluster-node"
    noun: str  # how messages name one, e.g. "cluster node"
    states: type[S]
    initial: S
    moves: Mapping[S, frozenset[S]]

    def __post_init__(self) -> None:
        if set(self.moves) != set(self.states):
            raise ValueError(f"the {self.noun} transition table must list every state exactly once")
        strays = {t for targets in self.moves.values() for t in targets} - set(self.states)
        if strays:
            raise ValueError(f"the {self.noun} transition table moves to unknown states {strays}")

    @property
    def final(self) -> frozenset[S]:
        return frozenset(state for state, targets in self.moves.items() if not targets)

    def allows(self, current: S, new: S) -> bool:
        return new in self.moves[current]

    def check(self, current: S, new: S) -> None:
        if not self.allows(current, new):
            raise IllegalTransition(f"a {self.noun} cannot go from {current} to {new}")

    def reachable(self) -> frozenset[S]:
        """Every state some sequence of moves leads to from the initial one (the initial one included)."""
        seen = {self.initial}
        frontier = [self.initial]
        while frontier:
            for following in self.moves[frontier.pop()]:
                if following not in seen:
                    seen.add(following)
                    frontier.append(following)
        return frozenset(seen)


# -- clusters, instance groups, nodes -----------------------------------------------------------------


class ClusterStatus(StrEnum):
    """The ClusterStatus values hyperplan sets: a cluster is InService once created (its nodes come and
    go on their own), and Deleting until its last node is gone, when its row is removed."""

    IN_SERVICE = "InService"
    DELETING = "Deleting"


CLUSTER_LIFECYCLE = Lifecycle(
    kind="cluster",
    noun="cluster",
    states=ClusterStatus,
    initial=ClusterStatus.IN_SERVICE,
    moves={
        ClusterStatus.IN_SERVICE: frozenset({ClusterStatus.DELETING}),
        ClusterStatus.DELETING: frozenset(),
    },
)


class InstanceGroupStatus(StrEnum):
    """The InstanceGroupStatus hyperplan answers. A group has no stored status and so no lifecycle: it
    is InService from its creation until its cluster is gone (docs/DECISIONS.md, "Consumers")."""

    IN_SERVICE = "InService"


class NodeStatus(StrEnum):
    """A node's ClusterInstanceStatus, plus Terminated: gone, kept in the store and never on the wire."""

    PENDING = "Pending"
    RUNNING = "Running"
    FAILURE = "Failure"
    SHUTTING_DOWN = "ShuttingDown"
    TERMINATED = "Terminated"


# The store follows the back end, which it looks at from time to time: it may miss a state in between
# (a node that went Pending -> ShuttingDown -> Terminated between two looks is seen Terminated).
# Once told to shut down, a node only ends.
NODE_LIFECYCLE = Lifecycle(
    kind="cluster-node",
    noun="cluster node",
    states=NodeStatus,
    initial=NodeStatus.PENDING,
    moves={
        NodeStatus.PENDING: frozenset(
            {NodeStatus.RUNNING, NodeStatus.FAILURE, NodeStatus.SHUTTING_DOWN, NodeStatus.TERMINATED}
        ),
        NodeStatus.RUNNING: frozenset({NodeStatus.FAILURE, NodeStatus.SHUTTING_DOWN, NodeStatus.TERMINATED}),
        NodeStatus.FAILURE: frozenset({NodeStatus.SHUTTING_DOWN, NodeStatus.TERMINATED}),
        NodeStatus.SHUTTING_DOWN: frozenset({NodeStatus.TERMINATED}),
        NodeStatus.TERMINATED: frozenset(),
    },
)


# -- money ----------------------------------------------------------------------------------------------


class InvoiceStatus(StrEnum):
    PENDING = "Pending"
    PAID = "Paid"
    REJECTED = "Rejected"  # by an administrator
    FAILED = "Failed"  # budget short, or not approved by the deadline


INVOICE_LIFECYCLE = Lifecycle(
    kind="invoice",
    noun="invoice",
    states=InvoiceStatus,
    initial=InvoiceStatus.PENDING,
    moves={
        InvoiceStatus.PENDING: frozenset({InvoiceStatus.PAID, InvoiceStatus.REJECTED, InvoiceStatus.FAILED}),
        InvoiceStatus.PAID: frozenset(),
        InvoiceStatus.REJECTED: frozenset(),
        InvoiceStatus.FAILED: frozenset(),
    },
)


class ExtensionPaymentStatus(StrEnum):
    """How an extension's payment stands: Failed when its invoice failed or its plan did first."""

    PENDING = "Pending"
    PAID = "Paid"
    FAILED = "Failed"


EXTENSION_LIFECYCLE = Lifecycle(
    kind="plan-extension",
    noun="plan extension",
    states=ExtensionPaymentStatus,
    initial=ExtensionPaymentStatus.PENDING,
    moves={
        ExtensionPaymentStatus.PENDING: frozenset(
            {ExtensionPaymentStatus.PAID, ExtensionPaymentStatus.FAILED}
        ),
        ExtensionPaymentStatus.PAID: frozenset(),
        ExtensionPaymentStatus.FAILED: frozenset(),
    },
)


# -- access keys ----------------------------------------------------------------------------------------


class KeyStatus(StrEnum):
    """An access key's status, as IAM's: an inactive key signs nothing until it is activated again."""

    ACTIVE = "Active"
    INACTIVE = "Inactive"


# A key goes back and forth; it ends by its deletion (its row kept, revoked_at set: its id is never given
# twice), whatever its status, so no status is final. services/accounts/users.py is the one place that
# sets one; its moves are recorded in the audit trail (key.activate, key.deactivate), not in status_events.
KEY_LIFECYCLE = Lifecycle(
    kind="access-key",
    noun="access key",
    states=KeyStatus,
    initial=KeyStatus.ACTIVE,
    moves={
        KeyStatus.ACTIVE: frozenset({KeyStatus.INACTIVE}),
        KeyStatus.INACTIVE: frozenset({KeyStatus.ACTIVE}),
    },
)

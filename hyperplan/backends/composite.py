"""Two back ends behind one: new work goes to the first, and work that lives in the second (a legacy
root) stays there until it ends.

The server upgraded from a version that kept its nodes and tasks in ``DATA_DIR/backend`` builds one of
these at start (``hyperplan.app.with_legacy_work``): a :class:`LocalBackend` over the work directory for
new work, and one over the old root, which adopts what the store still knows there (those processes keep
running, as the server's own user, until they end) and serves every call about it. A ref is routed by
where it lives: the legacy root holds it if its record is there. A task started on a legacy node goes to
that node. Once the old root holds nothing, the next start builds no composite.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from signal import Signals

from hyperplan.backends.base import (
    EXEC_OUTPUT_LIMIT,
    AdoptReport,
    Backend,
    ExecResult,
    LogChunk,
    LogStream,
    NodeRef,
    NodeSpec,
    NodeStatus,
    Ref,
    RunAs,
    TaskRef,
    TaskSpec,
    TaskStatus,
    TimedLines,
    check_id,
)
from hyperplan.backends.layout import Layout


def holds_work(root: Path) -> bool:
    """Whether a local back end's root has any node or task recorded in it."""
    layout = Layout(root)
    return any(layout.node(i).spec.exists() for i in layout.node_ids()) or any(
        layout.task(i).spec.exists() for i in layout.task_ids()
    )


class RoutingBackend:
    """``primary`` for new work; ``legacy`` (a local back end over an old root) for what lives there."""

    def __init__(self, primary: Backend, legacy: Backend, legacy_root: Path) -> None:
        self.primary = primary
        self.legacy = legacy
        self._layout = Layout(legacy_root.resolve())

    def _in_legacy(self, ref: Ref) -> bool:
        if isinstance(ref, NodeRef):
            return self._layout.node(check_id("node id", ref.node_id)).spec.exists()
        return self._layout.task(check_id("task id", ref.task_id)).spec.exists()

    def _for(self, ref: Ref) -> Backend:
        return self.legacy if self._in_legacy(ref) else self.primary

    def provision(self, spec: NodeSpec) -> None:
        self._for(NodeRef(spec.node_id)).provision(spec)

    def run(self, spec: TaskSpec) -> None:
        on_legacy_node = spec.node_id is not None and self._in_legacy(NodeRef(spec.node_id))
        if on_legacy_node or self._in_legacy(TaskRef(spec.task_id)):
            self.legacy.run(spec)
        else:
            self.primary.run(spec)

    def node_status(self, node_id: str) -> NodeStatus:
        return self._for(NodeRef(node_id)).node_status(node_id)

    def task_status(self, task_id: str) -> TaskStatus:
        return self._for(TaskRef(task_id)).task_status(task_id)

    def signal(self, ref: Ref, sig: Signals, env: Mapping[str, str] | None = None) -> None:
        self._for(ref).signal(ref, sig, env)

    def terminate(
        self, ref: Ref, grace: timedelta, env: Mapping[str, str] | None = None, hook: str | None = None
    ) -> None:
        self._for(ref).terminate(ref, grace, env, hook)

    def exec(
        self,
        node_id: str,
        argv: Iterable[str],
        timeout: timedelta,
        env: Mapping[str, str] | None = None,
        output_limit: int = EXEC_OUTPUT_LIMIT,
    ) -> ExecResult:
        return self._for(NodeRef(node_id)).exec(node_id, argv, timeout, env, output_limit)

    def read_log(self, ref: Ref, stream: LogStream, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        return self._for(ref).read_log(ref, stream, offset, limit)

    def read_lines(
        self, ref: Ref, cursor: int = 0, limit: int = 1000, max_bytes: int | None = None
    ) -> TimedLines:
        return self._for(ref).read_lines(ref, cursor, limit, max_bytes)

    def adopt(self, known: Iterable[Ref]) -> AdoptReport:
        """Each back end adopts the known refs that live in it (and kills what it holds unknown)."""
        refs = list(known)
        old = [ref for ref in refs if self._in_legacy(ref)]
        new = [ref for ref in refs if not self._in_legacy(ref)]
        first, second = self.legacy.adopt(old), self.primary.adopt(new)
        return AdoptReport(
            running=first.running + second.running,
            ended=first.ended + second.ended,
            missing=first.missing + second.missing,
            killed=first.killed + second.killed,
            stray_pids=first.stray_pids + second.stray_pids,
        )

    def forget(self, ref: Ref) -> None:
        self._for(ref).forget(ref)

    def clear_user(self, run_as: RunAs) -> None:
        self.primary.clear_user(run_as)  # one machine: the legacy root's work ran on it too

    def close(self) -> None:
        self.legacy.close()
        self.primary.close()

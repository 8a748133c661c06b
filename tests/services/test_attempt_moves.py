"""A job's attempt and its instances move only as their lifecycles list (core/jobs.py): the one write of
each goes through job_records, which refuses any other move."""

from __future__ import annotations

import pytest

from hyperplan.core.jobs import AttemptState, InstanceState
from hyperplan.core.status import IllegalTransition
from hyperplan.services.jobs.job_records import begin_attempt, move_attempt, move_instance
from hyperplan.store.schema import TrainingJob, TrainingJobInstance


def test_an_attempt_begins_only_between_attempts_and_counts() -> None:
    job = TrainingJob(attempt=0, attempt_state="")
    begin_attempt(job)
    assert (job.attempt, job.attempt_state) == (1, AttemptState.LAUNCHING)
    with pytest.raises(IllegalTransition, match="while one is launching"):
        begin_attempt(job)
    for state in (AttemptState.RUNNING, AttemptState.ENDING, AttemptState.ENDED):
        move_attempt(job, state)
    begin_attempt(job)  # the next segment's
    assert (job.attempt, job.attempt_state) == (2, AttemptState.LAUNCHING)


def test_an_attempt_never_goes_back_and_an_instance_never_comes_back() -> None:
    job = TrainingJob(attempt=1, attempt_state=AttemptState.RUNNING)
    with pytest.raises(IllegalTransition, match="cannot go from running to launching"):
        move_attempt(job, AttemptState.LAUNCHING)
    assert job.attempt_state == AttemptState.RUNNING  # nothing written
    instance = TrainingJobInstance(state=InstanceState.RECORDED)
    move_instance(instance, InstanceState.RUNNING)
    move_instance(instance, InstanceState.LOST)
    with pytest.raises(IllegalTransition, match="cannot go from Lost to Running"):
        move_instance(instance, InstanceState.RUNNING)

"""The native route for a training job that books its own capacity: a CreateTrainingJob request (as the
SageMaker API takes it, JSON) and the auto-book structure beside it (core/auto_book.py).

docs/API.md documents the route and the structure. The handler translates; the rules live in
hyperplan.services.jobs (TrainingJobSpec, jobs.create, auto_booking). The request is checked as the
SageMaker API checks CreateTrainingJob (its model, then TrainingJobSpec.from_wire), so a job made here
and one made with the tag ``hyperplan:auto-book`` are refused and kept alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.routing import Route

from hyperplan.core.auto_book import TAG_KEY, from_native
from hyperplan.errors import ValidationError
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.jobs import jobs
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.plans import tags
from hyperplan.services.plans.tags import Tag
from hyperplan.wire import model, validate

JOB = "TrainingJob"
AUTO_BOOK = "AutoBook"


def create_job(request: NativeRequest) -> dict[str, Any]:
    """A training job that books its own capacity; answers its ARN, as CreateTrainingJob does."""
    runtime, body = request.runtime, request.body
    given = body.get(JOB)
    if not isinstance(given, Mapping):
        raise ValidationError(
            f"{JOB} is required: a CreateTrainingJob request as the SageMaker API takes it (JSON)."
        )
    if body.get(AUTO_BOOK) is None:
        raise ValidationError(
            f"{AUTO_BOOK} is required: the capacity the job books (a job that names its plan, or runs on "
            "demand, is CreateTrainingJob's)."
        )
    try:
        parsed = validate.parse_request(model.operation_model("CreateTrainingJob"), dict(given))
        spec = TrainingJobSpec.from_wire(
            parsed, runs_images=runtime.images is not None, across_nodes=runtime.slurm is not None
        )
    except ValidationError as refusal:
        raise ValidationError(f"{JOB}: {refusal.message}") from None
    if spec.auto_book is not None:
        raise ValidationError(
            f"{JOB}.Tags: the tag {TAG_KEY} asks for capacity too; give the request once, as {AUTO_BOOK}."
        )
    spec = spec.with_auto_book(from_native(body[AUTO_BOOK], AUTO_BOOK), AUTO_BOOK)
    given_tags = [Tag(t["Key"], t.get("Value", "")) for t in parsed.get("Tags", [])]
    tags.check(given_tags, f"{JOB}.Tags")
    arn = jobs.create(runtime, request.caller, spec)
    tags.tag_new(runtime, request.caller.account_id, arn, given_tags)
    return {"TrainingJobArn": arn}


def routes() -> list[Route]:
    return [NativeRoute("POST", "/api/v1/training-jobs", create_job, body=(JOB, AUTO_BOOK))]

"""Training jobs: the list, and a job's page (status and its history, the plan, checkpoints, the model,
and the log, which the page's script follows by polling ``.../log`` with the cursor of its last read)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from hyperplan.console.web import ConsoleRequest, Page
from hyperplan.services.jobs import job_logs, job_views
from hyperplan.services.orchestration import console_views

LOG_HOST = "algo-1"


def jobs_list(request: ConsoleRequest) -> Page:
    return Page("jobs.html", {"jobs": job_views.summaries(request.runtime, request.caller)})


def job_detail(request: ConsoleRequest) -> Page:
    job = job_views.describe(request.runtime, request.caller, request.path["name"])
    artefacts = console_views.job_artefacts(request.runtime, request.caller, job.name)
    return Page("job.html", {"job": job, "artefacts": artefacts, "plan_arn": job.request.plan_arn})


def job_log(request: ConsoleRequest) -> JSONResponse:
    """One page of the first instance's output from `cursor` (from the start without one)."""
    cursor = request.query.get("cursor") or None
    page = job_logs.read_logs(
        request.runtime, request.caller, request.path["name"], LOG_HOST, "stdout", cursor
    )
    return JSONResponse(
        {"data": page.data.decode(errors="replace"), "cursor": page.cursor, "done": page.done},
        headers={"Cache-Control": "no-store"},
    )

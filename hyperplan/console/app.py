"""The console's routes, mounted by the server under /console (server/app.py).

Each route names its handler, the rate limit class of an action (a page is a read), and whether only
administrators may use it; ``web.py`` does the rest the same way for all of them. Tests enumerate
``routes()`` to try every one of them as another account.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from hyperplan.console import admin, clusters, favicon, jobs, plans, signin, usage
from hyperplan.console.web import PREFIX, Console, ConsoleRequest, ConsoleRoute, Page, Redirect
from hyperplan.core.rate_limits import RequestClass
from hyperplan.errors import UnknownRoute

STATIC = Path(__file__).parent / "static"


def home(request: ConsoleRequest) -> Redirect:
    return Redirect("/plans")


def not_found(request: ConsoleRequest) -> Page:
    raise UnknownRoute("There is no such console page.")


# Pages that are not one resource's live outside /plans/ and /clusters/, so that no plan or cluster
# name (letters, digits, hyphens) can be shadowed by them.
def routes() -> list[BaseRoute]:
    console = Console()
    search, purchase, write = RequestClass.SEARCH, RequestClass.PURCHASE, RequestClass.WRITE

    def get(
        path: str, handler: Callable[..., Any], *, admin: bool = False, public: bool = False
    ) -> ConsoleRoute:
        return ConsoleRoute("GET", path, handler, console, admin=admin, public=public)

    def post(
        path: str,
        handler: Callable[..., Any],
        request_class: RequestClass = write,
        *,
        admin: bool = False,
        public: bool = False,
    ) -> ConsoleRoute:
        return ConsoleRoute(
            "POST", path, handler, console, request_class=request_class, admin=admin, public=public
        )

    return [
        Route("/favicon.ico", favicon.favicon, methods=["GET"]),  # the site's, asked for on every page
        get("/sign-in", signin.sign_in_form, public=True),
        post("/sign-in", signin.sign_in, public=True),
        post("/sign-out", signin.sign_out, public=True),
        Mount(PREFIX + "/static", app=StaticFiles(directory=STATIC), name="console-static"),
        get("", home),
        get("/", home),
        get("/plans", plans.plans_list),
        get("/offerings", plans.search_form),
        post("/offerings", plans.search, search),
        post("/offerings/review", plans.review, RequestClass.READ),
        post("/offerings/purchase", plans.purchase, purchase),
        get("/plans/{name}", plans.plan_detail),
        post("/plans/{name}/extensions", plans.extension_search, search),
        post("/plans/{name}/extend", plans.extend, purchase),
        post("/plans/{name}/extension-policy", plans.set_extension_policy),
        post("/plans/{name}/extension-policy/off", plans.clear_extension_policy),
        post("/plans/{name}/lending", plans.set_lending),
        post("/plans/{name}/lending/off", plans.clear_lending),
        post("/plans/{name}/return-quote", plans.quote_return),
        post("/plans/{name}/return", plans.carry_out_return, purchase),
        get("/capacity", plans.capacity),
        get("/usage", usage.usage_page),
        get("/clusters", clusters.clusters_list),
        get("/new-cluster", clusters.new_cluster),
        post("/new-cluster", clusters.create_cluster),
        get("/clusters/{name}", clusters.cluster_detail),
        post("/clusters/{name}/groups", clusters.add_group),
        post("/clusters/{name}/groups/{group}/plans", clusters.add_group_plan),
        post("/clusters/{name}/groups/{group}/plans/remove", clusters.remove_group_plan),
        get("/training-jobs", jobs.jobs_list),
        get("/training-jobs/{name}", jobs.job_detail),
        get("/training-jobs/{name}/log", jobs.job_log),
        get("/admin", admin.admin_page, admin=True),
        post("/admin/invoices/{invoice}/approve", admin.approve, admin=True),
        post("/admin/invoices/{invoice}/reject", admin.reject, admin=True),
        post("/admin/accounts/{account}", admin.update_account, admin=True),
        get("/{rest:path}", not_found),
    ]

"""Native routes for container registries (administrators): the fleet's registries and the credentials
stored for them. A password goes in, sealed; no answer carries one.

docs/API.md documents the routes. Handlers translate; the rules live in
hyperplan.services.accounts.registry_credentials.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.accounts import registry_credentials
from hyperplan.services.accounts.registry_credentials import MAX_PASSWORD, MAX_USERNAME, RegistryView


def _registry_json(view: RegistryView) -> dict[str, Any]:
    return {
        "Host": view.host,
        "Insecure": view.insecure,
        "InFleet": view.in_fleet,
        "Username": view.username,
        "CredentialsSetAt": view.set_at,
    }


def list_registries(request: NativeRequest) -> dict[str, Any]:
    runtime = request.runtime
    found = registry_credentials.list_registries(runtime.db, runtime.fleet.image_sources.registries)
    return {"Registries": [_registry_json(view) for view in found]}


def set_credentials(request: NativeRequest) -> dict[str, Any]:
    runtime = request.runtime
    stored = registry_credentials.set_credentials(
        runtime.db,
        runtime.secret_box,
        request.caller,
        request.path["host"],
        fields.required_text(request.body, "Username", max_length=MAX_USERNAME),
        fields.required_text(request.body, "Password", max_length=MAX_PASSWORD),
        runtime.clock.now(),
    )
    return {"Host": stored.host, "Username": stored.username, "CredentialsSetAt": stored.set_at}


def delete_credentials(request: NativeRequest) -> dict[str, Any]:
    runtime = request.runtime
    host = registry_credentials.delete_credentials(
        runtime.db, request.caller, request.path["host"], runtime.clock.now()
    )
    return {"Host": host, "Deleted": True}


def routes() -> list[Route]:
    return [
        NativeRoute("GET", "/api/v1/registries", list_registries, admin=True),
        NativeRoute(
            "POST",
            "/api/v1/registries/{host}/credentials",
            set_credentials,
            admin=True,
            body=("Username", "Password"),
        ),
        NativeRoute("DELETE", "/api/v1/registries/{host}/credentials", delete_credentials, admin=True),
    ]

"""api_docs: documentation of every app and API, generated from the API functions themselves."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, api_doc

APP = App("api_docs", "Documentation of the apps and their APIs.")

AppName = Annotated[str, P("name of an app, e.g. 'music'")]


def _app(w: Any, app_name: str) -> Any:
    if app_name not in w.apps:
        raise ApiError(404, f"api_docs: unknown app_name {app_name!r}; apps are {sorted(w.apps)}")
    return w.apps[app_name]


@APP.api
def show_app_descriptions(w: Any) -> list:
    """List every app with a one-line description.

    Returns: a list of {"name", "description"}.
    """
    return [{"name": a.name, "description": a.description} for a in w.apps.values()]


@APP.api
def show_api_descriptions(w: Any, app_name: AppName) -> list:
    """List the APIs of one app with a one-line description each.

    Returns: a list of {"name", "description"}.
    """
    return [{"name": a.name, "description": a.description} for a in _app(w, app_name).apis.values()]


@APP.api
def show_api_doc(
    w: Any, app_name: AppName, api_name: Annotated[str, P("name of the API, e.g. 'login'")]
) -> dict:
    """Show the full documentation of one API: parameters (types, defaults, constraints) and result.

    Returns: {"app_name", "api_name", "description", "parameters": [...], "returns"}.
    """
    app = _app(w, app_name)
    if api_name not in app.apis:
        raise ApiError(
            404, f"api_docs: app {app_name!r} has no api_name {api_name!r}; see show_api_descriptions"
        )
    return api_doc(app.apis[api_name])

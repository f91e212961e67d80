"""The agent-facing ``apis`` object: a thin proxy that turns ``apis.app.api(**kwargs)`` into
``dispatch(app, api, kwargs)``. It holds no world data - only the dispatch callable - so the same
class works in-process and in the sandbox worker, where ``dispatch`` sends the call over a pipe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Dispatch = Callable[[str, str, dict[str, Any]], Any]


class Apis:
    """``apis.<app>`` -> an app proxy. Keyword arguments only (they map 1:1 onto API parameters)."""

    __slots__ = ("_dispatch",)

    def __init__(self, dispatch: Dispatch) -> None:
        object.__setattr__(self, "_dispatch", dispatch)

    def __getattr__(self, app: str) -> _AppProxy:
        if app.startswith("__"):
            raise AttributeError(app)
        return _AppProxy(app, self._dispatch)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("apis is read-only")

    def __repr__(self) -> str:
        return "<apis: call apis.<app>.<api>(name=value, ...); see apis.api_docs.show_app_descriptions()>"


class _AppProxy:
    __slots__ = ("_app", "_dispatch")

    def __init__(self, app: str, dispatch: Dispatch) -> None:
        self._app, self._dispatch = app, dispatch

    def __getattr__(self, api: str) -> Callable[..., Any]:
        if api.startswith("__"):
            raise AttributeError(api)
        app, dispatch = self._app, self._dispatch

        def call(*args: Any, **kwargs: Any) -> Any:
            if args:
                raise TypeError(
                    f"apis.{app}.{api}() takes keyword arguments only, e.g. apis.{app}.{api}(name=value); "
                    f"see apis.api_docs.show_api_doc(app_name={app!r}, api_name={api!r})"
                )
            return dispatch(app, api, kwargs)

        call.__name__ = call.__qualname__ = f"{app}.{api}"
        return call

    def __repr__(self) -> str:
        return f"<apis.{self._app}>"

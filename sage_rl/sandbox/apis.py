"""The agent's ``apis`` object in the worker: ``apis.<app>.<api>(**kwargs)`` is a call through the
bridge to the parent, which owns the world. ``apis`` and its apps take no attributes and keep no
state: the library's code reads them too (``string.Template.__init__(apis, v)`` would otherwise set
one, and a cache of the names looked up told a skill's ``dir(apis)`` that the task had read
``apis.a20``: the review of session 42). Each lookup makes a new proxy (well under a microsecond,
against an API call's round trip to the parent).

This module is imported by the template process: it imports nothing of the project.
"""

from __future__ import annotations

from typing import Any

Bridge = Any  # worker.Bridge: ``call(app, api, kwargs)``


class _Api:
    __slots__ = ("_bridge", "_app", "_api")

    def __init__(self, bridge: Bridge, app: str, api: str) -> None:
        self._bridge, self._app, self._api = bridge, app, api

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"apis.{self._app}.{self._api} takes keyword arguments only, e.g. name=value")
        return self._bridge.call(self._app, self._api, kwargs)

    def __repr__(self) -> str:
        return f"<api apis.{self._app}.{self._api}>"


class _ReadOnly:
    """No attributes, whoever sets them (``string.Template.__init__(apis, v)`` is library code)."""

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("apis is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("apis is read-only")


class _App(_ReadOnly):
    """``apis.<app>``: its ``<api>`` attributes are made on each lookup."""

    def __init__(self, bridge: Bridge, app: str) -> None:
        self.__dict__["_bridge"], self.__dict__["_app"] = bridge, app

    def __getattr__(self, api: str) -> _Api:
        if api.startswith("__"):
            raise AttributeError(api)
        return _Api(self._bridge, self._app, api)

    def __repr__(self) -> str:
        return f"<app apis.{self._app}>"


class Apis(_ReadOnly):
    """``apis.<app>.<api>(**kwargs)``: each call goes to the parent, which owns the world."""

    def __init__(self, bridge: Bridge) -> None:
        self.__dict__["_bridge"] = bridge

    def __getattr__(self, app: str) -> _App:
        if app.startswith("__"):
            raise AttributeError(app)
        return _App(self._bridge, app)

    def __repr__(self) -> str:
        return "<apis: call apis.<app>.<api>(**kwargs)>"


#: The classes of ``apis``, its apps and their APIs: agent code reaches them through ``type()``.
PROXY_CLASSES = (Apis, _App, _Api)

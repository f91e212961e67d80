"""The API layer of PocketWorld: one decorator turns a typed, documented function into an API.

An API is a plain function ``fn(w: World, <params>) -> JSON-able``. Its signature (with
``typing.Annotated[T, P(...)]`` for descriptions and constraints) and its docstring are the single
source of truth: ``validate`` checks calls against it before the function runs, and
``api_doc`` renders ``api_docs.show_api_doc`` from it, so docs and validation cannot drift.

Errors are ``ApiError(status, message)`` with HTTP-like statuses (401 auth, 404 not found,
409 conflict, 422 validation). Functions look everything up and validate before they mutate, so a
failing call leaves the world as it was.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from sage_rl.envs.pocketworld.bounds import brief


class ApiError(Exception):
    """An API call failed. ``status`` is HTTP-like; ``message`` names the offending parameter."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across the sandbox pipe
        return (ApiError, (self.status, self.message))


@dataclass(frozen=True)
class P:
    """Parameter metadata for ``Annotated``: a description and optional constraints."""

    doc: str
    ge: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] | None = None
    min_len: int | None = None
    max_len: int | None = None

    def constraints(self) -> dict[str, Any]:
        names = ("ge", "le", "choices", "min_len", "max_len")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


PageIndex = Annotated[int, P("0-based index of the page to return", ge=0)]
PageLimit = Annotated[int, P("maximum number of items per page", ge=1, le=20)]
Token = Annotated[str, P("access token returned by this app's login API", min_len=1)]


@dataclass(frozen=True)
class Param:
    name: str
    kind: Any  # a plain type, ``list[T]`` or ``T | None``
    meta: P
    required: bool
    default: Any = None

    @property
    def type_name(self) -> str:
        return _type_name(self.kind)


@dataclass(frozen=True)
class Api:
    app: str
    name: str
    fn: Callable[..., Any]
    params: tuple[Param, ...]
    description: str
    returns: str


@dataclass
class App:
    """One app: a name, a description and its APIs, registered with ``@app.api``."""

    name: str
    description: str
    apis: dict[str, Api] = field(default_factory=dict)

    def api(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.apis[fn.__name__] = _make_api(self.name, fn)
        return fn


def add_auth_apis(app: App) -> None:
    """Register the ``login`` and ``logout`` APIs that every app except supervisor/api_docs has.

    They are ordinary API functions (signature + docstring), so their docs and validation are
    generated like every other API's.
    """

    def login(
        w: Any, username: Annotated[str, P("account email")], password: Annotated[str, P("account password")]
    ) -> dict:
        return w.login(app.name, username, password)

    def logout(w: Any, access_token: Token) -> dict:
        return w.logout(app.name, access_token)

    login.__doc__ = f"""Log in to {app.name}. Returns: {{"access_token", "token_type", "expires_at"}}."""
    logout.__doc__ = """Log out: the access token stops working. Returns: {"message"}."""
    app.api(login)
    app.api(logout)


def _make_api(app: str, fn: Callable[..., Any]) -> Api:
    hints = typing.get_type_hints(fn, include_extras=True)
    sig = inspect.signature(fn)
    params = []
    for name, sp in list(sig.parameters.items())[1:]:  # the first parameter is the world
        hint = hints[name]
        if typing.get_origin(hint) is not Annotated:
            raise TypeError(f"{app}.{fn.__name__}: parameter {name!r} needs Annotated[T, P(...)]")
        kind, meta = hint.__origin__, hint.__metadata__[0]
        required = sp.default is inspect.Parameter.empty
        params.append(Param(name, kind, meta, required, None if required else sp.default))
    doc = inspect.cleandoc(fn.__doc__ or "")
    description, _, returns = doc.partition("Returns:")
    return Api(app, fn.__name__, fn, tuple(params), " ".join(description.split()), " ".join(returns.split()))


def _type_name(kind: Any) -> str:
    if isinstance(kind, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(kind))
    if typing.get_origin(kind) is list:
        return f"list[{_type_name(typing.get_args(kind)[0])}]"
    return "null" if kind is type(None) else kind.__name__


def _check_type(value: Any, kind: Any) -> Any:
    """Return ``value`` coerced to ``kind`` (int -> float only), or raise TypeError."""
    if isinstance(kind, types.UnionType):
        for k in typing.get_args(kind):
            try:
                return _check_type(value, k)
            except TypeError:
                pass
        raise TypeError
    if kind is type(None):
        if value is None:
            return None
        raise TypeError
    if typing.get_origin(kind) is list:
        if not isinstance(value, (list, tuple)):
            raise TypeError
        return [_check_type(v, typing.get_args(kind)[0]) for v in value]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise TypeError from None
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise TypeError  # NaN and infinity would pass every >=/<= bound and poison balances
    if isinstance(value, bool) and kind is not bool:
        raise TypeError
    if not isinstance(value, kind):
        raise TypeError
    return value


def _type_message(api: Api, p: Param, value: Any) -> str:
    where = f"{api.app}.{api.name}: parameter {p.name!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} must be a finite number, got {value!r} (NaN and infinity are refused)"
    return f"{where} must be {p.type_name}, got {type(value).__name__} {brief(value)}"


def _check_constraints(api: Api, p: Param, value: Any) -> None:
    m, where = p.meta, f"{api.app}.{api.name}: parameter {p.name!r}"
    if value is None:
        return
    if m.ge is not None and value < m.ge:
        raise ApiError(422, f"{where} must be >= {m.ge:g}, got {brief(value)}")
    if m.le is not None and value > m.le:
        raise ApiError(422, f"{where} must be <= {m.le:g}, got {brief(value)}")
    if m.choices is not None and value not in m.choices:
        raise ApiError(422, f"{where} must be one of {list(m.choices)}, got {brief(value)}")
    if m.min_len is not None and len(value) < m.min_len:
        raise ApiError(422, f"{where} must have length >= {m.min_len}, got {brief(value)}")
    if m.max_len is not None and len(value) > m.max_len:
        raise ApiError(422, f"{where} must have length <= {m.max_len}, got length {len(value)}")


def validate(api: Api, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check ``kwargs`` against the API's signature; return the arguments with defaults filled.

    Raises ApiError(422) naming the unknown, missing or ill-typed parameter.
    """
    known = {p.name: p for p in api.params}
    for name in kwargs:
        if name not in known:
            raise ApiError(
                422,
                f"{api.app}.{api.name} has no parameter {brief(name)}; its parameters are {sorted(known)}",
            )
    out: dict[str, Any] = {}
    for p in api.params:
        if p.name not in kwargs:
            if p.required:
                raise ApiError(
                    422, f"{api.app}.{api.name}: missing required parameter {p.name!r} ({p.type_name})"
                )
            out[p.name] = p.default
            continue
        try:
            value = _check_type(kwargs[p.name], p.kind)
        except TypeError:
            raise ApiError(422, _type_message(api, p, kwargs[p.name])) from None
        _check_constraints(api, p, value)
        out[p.name] = value
    return out


def api_doc(api: Api) -> dict[str, Any]:
    """The documentation of one API, generated from its signature and docstring."""
    return {
        "app_name": api.app,
        "api_name": api.name,
        "description": api.description,
        "parameters": [
            {
                "name": p.name,
                "type": p.type_name,
                "required": p.required,
                "default": p.default,
                "description": p.meta.doc,
                "constraints": p.meta.constraints(),
            }
            for p in api.params
        ],
        "returns": api.returns,
    }


def page(items: list[Any], page_index: int, page_limit: int) -> list[Any]:
    """One page of ``items``: ``items[page_index*page_limit : (page_index+1)*page_limit]``."""
    start = page_index * page_limit
    return items[start : start + page_limit]


def plain(value: Any) -> Any:
    """A deep copy made of JSON-able values only, so results never alias the world's data."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"API result is not JSON-able: {type(value).__name__}")

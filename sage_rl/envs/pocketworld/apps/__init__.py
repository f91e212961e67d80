"""PocketWorld's apps, one module each. ``APPS`` is the explicit list the World dispatches over."""

from __future__ import annotations

from sage_rl.envs.pocketworld.api import App
from sage_rl.envs.pocketworld.apps import (
    api_docs,
    email,
    files,
    music,
    notes,
    payments,
    phone,
    shopping,
    splitwise,
    supervisor,
    todo,
)

APPS: dict[str, App] = {
    m.APP.name: m.APP
    for m in (supervisor, api_docs, music, payments, phone, email, files, notes, todo, shopping, splitwise)
}

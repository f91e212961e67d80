"""supervisor: the person the agent works for - profile, passwords, cards, addresses, completion."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld import bounds
from sage_rl.envs.pocketworld.api import ApiError, App, P, plain

APP = App("supervisor", "The supervisor (the user you act for): profile, passwords, cards, addresses.")


@APP.api
def show_profile(w: Any) -> dict:
    """Show the supervisor's profile.

    Returns: {"first_name", "last_name", "email", "phone_number", "birthday"}.
    """
    return w.db["supervisor"]["profile"]["me"]


@APP.api
def show_account_passwords(w: Any) -> list:
    """Show the supervisor's password for every app account; log in with the profile email.

    Returns: a list of {"account_name", "password"}.
    """
    return [w.db["supervisor"]["passwords"][k] for k in sorted(w.db["supervisor"]["passwords"])]


@APP.api
def show_payment_cards(w: Any) -> list:
    """Show the supervisor's payment cards.

    Returns: a list of {"card_id", "card_name", "owner_name", "last_four", "expiry", "balance"}.
    """
    return list(w.db["supervisor"]["payment_cards"].values())


@APP.api
def show_addresses(w: Any) -> list:
    """Show the supervisor's saved addresses.

    Returns: a list of {"address_id", "name", "street", "city", "state", "zip_code"}.
    """
    return list(w.db["supervisor"]["addresses"].values())


@APP.api
def show_current_time(w: Any) -> dict:
    """Show the current date and time in this world (use it for "today", "last week", ...).

    Returns: {"now": ISO date-time, "date": YYYY-MM-DD, "weekday": e.g. "monday"}.
    """
    return {"now": w.now_iso(), "date": w.now.date().isoformat(), "weekday": w.now.strftime("%A").lower()}


@APP.api
def complete_task(
    w: Any,
    answer: Annotated[
        str | int | float | bool | list | None, P("the task's answer, if it asks for one")
    ] = None,
) -> dict:
    """Mark the task complete and record the answer (omit it for tasks that ask for none). Ends the episode.

    Returns: {"message": "task completed"}.
    """
    where = "supervisor.complete_task: parameter 'answer'"
    try:
        size = bounds.json_size(where, answer, bounds.MAX_ANSWER_CHARS)
    except bounds.InputError as e:
        raise ApiError(e.status, str(e)) from None
    if size > bounds.MAX_ANSWER_CHARS:
        raise ApiError(422, f"{where} is too large (more than {bounds.MAX_ANSWER_CHARS} characters of JSON)")
    try:
        w.answer = plain(answer)  # a copy made of JSON values only
    except TypeError:
        raise ApiError(422, f"{where} must be JSON-able, got {bounds.brief(answer)}") from None
    w.completed = True
    return {"message": "task completed"}

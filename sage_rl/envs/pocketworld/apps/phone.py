"""phone: contacts (with relationships), text messages and alarms."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, PageIndex, PageLimit, Token, add_auth_apis, page

APP = App("phone", "Phone: contacts with relationships and birthdays, text messages, alarms.")
add_auth_apis(APP)
A = "phone"

RELATIONSHIPS = ("friend", "family", "coworker", "roommate")
ContactId = Annotated[int, P("ID of the contact", ge=1)]
Phone = Annotated[str, P("phone number, e.g. '+1-555-0142'", min_len=5)]
AlarmId = Annotated[int, P("ID of the alarm", ge=1)]
Time = Annotated[str, P("time of day as HH:MM (24h)", min_len=5, max_len=5)]


def _contact(w: Any, me: str, contact_id: int) -> dict:
    c = w.get(A, "contacts", contact_id, "contact")
    if c["owner"] != me:
        raise ApiError(404, f"phone: no contact with contact_id {contact_id}")
    return c


def _check_time(time: str) -> None:
    hh, _, mm = time.partition(":")
    if not (hh.isdigit() and mm.isdigit() and int(hh) < 24 and int(mm) < 60):
        raise ApiError(422, f"phone: parameter 'time' must be HH:MM, got {time!r}")


def _public(c: dict) -> dict:
    return {k: v for k, v in c.items() if k != "owner"}


@APP.api
def search_contacts(
    w: Any,
    access_token: Token,
    query: Annotated[str, P("words to match in name, email or phone number (empty: all)")] = "",
    relationship: Annotated[
        str | None, P("only contacts with this relationship", choices=RELATIONSHIPS)
    ] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """Search your contacts, ordered by contact_id.

    Returns: a list of {"contact_id", "first_name", "last_name", "email", "phone_number", "relationship", "birthday"}.
    """
    me = w.user(A, access_token)
    q = query.lower().strip()
    rows = [
        _public(c)
        for c in w.table(A, "contacts").values()
        if c["owner"] == me
        and (relationship is None or c["relationship"] == relationship)
        and q in f"{c['first_name']} {c['last_name']} {c['email']} {c['phone_number']}".lower()
    ]
    return page(rows, page_index, page_limit)


@APP.api
def show_contact(w: Any, access_token: Token, contact_id: ContactId) -> dict:
    """Show one contact. Returns: {"contact_id", "first_name", "last_name", "email", "phone_number", "relationship", "birthday"}."""
    return _public(_contact(w, w.user(A, access_token), contact_id))


@APP.api
def add_contact(
    w: Any,
    access_token: Token,
    first_name: Annotated[str, P("first name", min_len=1)],
    last_name: Annotated[str, P("last name")],
    phone_number: Phone,
    email: Annotated[str, P("email address")] = "",
    relationship: Annotated[str, P("relationship to you", choices=RELATIONSHIPS)] = "friend",
    birthday: Annotated[str | None, P("birthday as YYYY-MM-DD")] = None,
) -> dict:
    """Add a contact (409 if a contact has that phone number). Returns: {"contact_id"}."""
    me = w.user(A, access_token)
    if any(c["owner"] == me and c["phone_number"] == phone_number for c in w.table(A, "contacts").values()):
        raise ApiError(409, f"phone: a contact with phone_number {phone_number!r} exists")
    cid = w.new_id(A, "contacts")
    w.table(A, "contacts")[cid] = {
        "contact_id": cid, "owner": me, "first_name": first_name, "last_name": last_name, "email": email,
        "phone_number": phone_number, "relationship": relationship, "birthday": birthday,
    }  # fmt: skip
    return {"contact_id": cid}


@APP.api
def update_contact_relationship(
    w: Any,
    access_token: Token,
    contact_id: ContactId,
    relationship: Annotated[str, P("new relationship", choices=RELATIONSHIPS)],
) -> dict:
    """Change a contact's relationship. Returns: {"contact_id", "relationship"}."""
    _contact(w, w.user(A, access_token), contact_id)["relationship"] = relationship
    return {"contact_id": contact_id, "relationship": relationship}


@APP.api
def delete_contact(w: Any, access_token: Token, contact_id: ContactId) -> dict:
    """Delete a contact. Returns: {"message"}."""
    _contact(w, w.user(A, access_token), contact_id)
    del w.table(A, "contacts")[contact_id]
    return {"message": f"contact {contact_id} deleted"}


@APP.api
def show_text_messages(
    w: Any,
    access_token: Token,
    phone_number: Annotated[str | None, P("only messages exchanged with this phone number")] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """List your text messages, newest first.

    Returns: a list of {"message_id", "sender", "receiver", "message", "sent_at"} (sender/receiver are phone numbers).
    """
    me = w.user(A, access_token)
    mine = w.db["supervisor"]["profile"]["me"]["phone_number"] if me == w.me else me
    rows = [
        m
        for m in w.table(A, "messages").values()
        if mine in (m["sender"], m["receiver"])
        and (phone_number is None or phone_number in (m["sender"], m["receiver"]))
    ]
    rows.sort(key=lambda m: (m["sent_at"], m["message_id"]), reverse=True)
    return page(rows, page_index, page_limit)


@APP.api
def send_text_message(
    w: Any,
    access_token: Token,
    phone_number: Phone,
    message: Annotated[str, P("text to send", min_len=1, max_len=500)],
) -> dict:
    """Send a text message to a phone number. Returns: {"message_id"}."""
    w.user(A, access_token)
    mine = w.db["supervisor"]["profile"]["me"]["phone_number"]
    if phone_number == mine:
        raise ApiError(422, "phone: phone_number is your own number")
    mid = w.new_id(A, "messages")
    w.table(A, "messages")[mid] = {
        "message_id": mid, "sender": mine, "receiver": phone_number, "message": message, "sent_at": w.now_iso()
    }  # fmt: skip
    return {"message_id": mid}


@APP.api
def delete_text_message(
    w: Any, access_token: Token, message_id: Annotated[int, P("ID of the message", ge=1)]
) -> dict:
    """Delete a text message. Returns: {"message"}."""
    w.user(A, access_token)
    w.get(A, "messages", message_id, "text message")
    del w.table(A, "messages")[message_id]
    return {"message": f"text message {message_id} deleted"}


@APP.api
def show_alarms(w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5) -> list:
    """List your alarms. Returns: a list of {"alarm_id", "time", "label", "enabled", "repeat_days"}."""
    me = w.user(A, access_token)
    return page(
        [_public(a) for a in w.table(A, "alarms").values() if a["owner"] == me], page_index, page_limit
    )


@APP.api
def create_alarm(
    w: Any,
    access_token: Token,
    time: Time,
    label: Annotated[str, P("label shown when it rings")] = "",
    repeat_days: Annotated[list[str], P("weekdays it repeats on, e.g. ['mon', 'tue']")] = [],  # noqa: B006
) -> dict:
    """Create an enabled alarm. Returns: {"alarm_id"}."""
    me = w.user(A, access_token)
    _check_time(time)
    aid = w.new_id(A, "alarms")
    w.table(A, "alarms")[aid] = {
        "alarm_id": aid, "owner": me, "time": time, "label": label, "enabled": True, "repeat_days": list(repeat_days)
    }  # fmt: skip
    return {"alarm_id": aid}


@APP.api
def update_alarm(
    w: Any,
    access_token: Token,
    alarm_id: AlarmId,
    enabled: Annotated[bool | None, P("turn the alarm on or off")] = None,
    time: Annotated[str | None, P("new time as HH:MM")] = None,
) -> dict:
    """Turn an alarm on/off or move it. Returns: {"alarm_id", "time", "enabled"}."""
    me = w.user(A, access_token)
    a = w.get(A, "alarms", alarm_id, "alarm")
    if a["owner"] != me:
        raise ApiError(404, f"phone: no alarm with alarm_id {alarm_id}")
    if time is not None:
        _check_time(time)
        a["time"] = time
    if enabled is not None:
        a["enabled"] = enabled
    return {"alarm_id": alarm_id, "time": a["time"], "enabled": a["enabled"]}


@APP.api
def delete_alarm(w: Any, access_token: Token, alarm_id: AlarmId) -> dict:
    """Delete an alarm. Returns: {"message"}."""
    me = w.user(A, access_token)
    if w.get(A, "alarms", alarm_id, "alarm")["owner"] != me:
        raise ApiError(404, f"phone: no alarm with alarm_id {alarm_id}")
    del w.table(A, "alarms")[alarm_id]
    return {"message": f"alarm {alarm_id} deleted"}

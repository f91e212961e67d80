"""email: your mailbox - inbox, sent mail, reading, sending, replying, forwarding."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, PageIndex, PageLimit, Token, add_auth_apis, page

APP = App("email", "Email: inbox and sent mail; read, send, reply, forward, star, delete.")
add_auth_apis(APP)
A = "email"

EmailId = Annotated[int, P("ID of the email", ge=1)]
Recipients = Annotated[list[str], P("email addresses to send to", min_len=1)]


def _mail(w: Any, email_id: int) -> dict:
    m = w.get(A, "emails", email_id, "email")
    if m["deleted"]:
        raise ApiError(404, f"email: email_id {email_id} was deleted")
    return m


def _summary(m: dict) -> dict:
    keys = ("email_id", "folder", "sender", "recipients", "subject", "sent_at", "read", "starred")
    return {k: m[k] for k in keys}


def _send(w: Any, recipients: list[str], subject: str, body: str, reply_to: int | None) -> int:
    known = w.table(A, "users")
    for r in recipients:
        if r not in known:
            raise ApiError(404, f"email: parameter 'recipients' has unknown address {r!r}")
    eid = w.new_id(A, "emails")
    w.table(A, "emails")[eid] = {
        "email_id": eid, "folder": "sent", "sender": w.me, "recipients": list(recipients), "subject": subject,
        "body": body, "sent_at": w.now_iso(), "read": True, "starred": False, "deleted": False, "reply_to": reply_to,
    }  # fmt: skip
    return eid


@APP.api
def show_emails(
    w: Any,
    access_token: Token,
    folder: Annotated[str, P("which folder", choices=("inbox", "sent"))] = "inbox",
    query: Annotated[str, P("words to match in subject or body (empty: all)")] = "",
    sender: Annotated[str | None, P("only emails from this address")] = None,
    unread_only: Annotated[bool, P("only unread emails")] = False,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """List emails of a folder, newest first (bodies omitted; use show_email).

    Returns: a list of {"email_id", "folder", "sender", "recipients", "subject", "sent_at", "read", "starred"}.
    """
    w.user(A, access_token)
    q = query.lower().strip()
    rows = [
        m
        for m in w.table(A, "emails").values()
        if not m["deleted"] and m["folder"] == folder
        and (not q or q in f"{m['subject']} {m['body']}".lower())
        and (sender is None or m["sender"] == sender)
        and not (unread_only and m["read"])
    ]  # fmt: skip
    rows.sort(key=lambda m: (m["sent_at"], m["email_id"]), reverse=True)
    return page([_summary(m) for m in rows], page_index, page_limit)


@APP.api
def show_email(w: Any, access_token: Token, email_id: EmailId) -> dict:
    """Show one email with its body (does not mark it read).

    Returns: {"email_id", "folder", "sender", "recipients", "subject", "body", "sent_at", "read", "starred", "reply_to"}.
    """
    w.user(A, access_token)
    return {k: v for k, v in _mail(w, email_id).items() if k != "deleted"}


@APP.api
def send_email(
    w: Any,
    access_token: Token,
    recipients: Recipients,
    subject: Annotated[str, P("subject line", min_len=1, max_len=200)],
    body: Annotated[str, P("the message")] = "",
) -> dict:
    """Send a new email. Returns: {"email_id"}."""
    w.user(A, access_token)
    return {"email_id": _send(w, recipients, subject, body, None)}


@APP.api
def reply_to_email(
    w: Any, access_token: Token, email_id: EmailId, body: Annotated[str, P("the reply", min_len=1)]
) -> dict:
    """Reply to the sender of an email; the subject gets a 'Re: ' prefix. Returns: {"email_id"}."""
    w.user(A, access_token)
    m = _mail(w, email_id)
    subject = m["subject"] if m["subject"].startswith("Re: ") else f"Re: {m['subject']}"
    return {"email_id": _send(w, [m["sender"]], subject, body, email_id)}


@APP.api
def forward_email(
    w: Any,
    access_token: Token,
    email_id: EmailId,
    recipients: Recipients,
    note: Annotated[str, P("text above the forwarded mail")] = "",
) -> dict:
    """Forward an email; the subject gets a 'Fwd: ' prefix. Returns: {"email_id"}."""
    w.user(A, access_token)
    m = _mail(w, email_id)
    body = f"{note}\n\n---------- Forwarded message ----------\nFrom: {m['sender']}\n\n{m['body']}".lstrip()
    return {"email_id": _send(w, recipients, f"Fwd: {m['subject']}", body, None)}


@APP.api
def mark_email(
    w: Any,
    access_token: Token,
    email_id: EmailId,
    read: Annotated[bool | None, P("mark read (true) or unread (false)")] = None,
    starred: Annotated[bool | None, P("star (true) or unstar (false)")] = None,
) -> dict:
    """Mark an email read/unread and/or starred/unstarred. Returns: {"email_id", "read", "starred"}."""
    w.user(A, access_token)
    m = _mail(w, email_id)
    if read is not None:
        m["read"] = read
    if starred is not None:
        m["starred"] = starred
    return {"email_id": email_id, "read": m["read"], "starred": m["starred"]}


@APP.api
def delete_email(w: Any, access_token: Token, email_id: EmailId) -> dict:
    """Delete an email. Returns: {"message"}."""
    w.user(A, access_token)
    _mail(w, email_id)["deleted"] = True
    return {"message": f"email {email_id} deleted"}


@APP.api
def search_addresses(
    w: Any, access_token: Token, query: Annotated[str, P("words to match in a name or address")], page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:  # fmt: skip
    """Search the address book of the mail server. Returns: a list of {"email", "name"}."""
    w.user(A, access_token)
    q = query.lower().strip()
    rows = [u for u in w.table(A, "users").values() if q in f"{u['name']} {u['email']}".lower()]
    return page(rows, page_index, page_limit)

"""payments: a Venmo-like app - balance, friends, transactions, payment requests."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, PageIndex, PageLimit, Token, add_auth_apis, page

APP = App("payments", "Venmo-like payments: balance, friends, sending money, payment requests.")
add_auth_apis(APP)
A = "payments"

Amount = Annotated[float, P("amount in dollars", ge=0.01, le=10000)]
Email = Annotated[str, P("email address of the other user", min_len=3)]
Note = Annotated[str, P("description shown with the payment", max_len=200)]
RequestId = Annotated[int, P("ID of the payment request", ge=1)]


def _other(w: Any, me: str, email: str, param: str) -> dict:
    user = w.table(A, "users").get(email)
    if user is None:
        raise ApiError(404, f"payments: no user with {param}={email!r}")
    if email == me:
        raise ApiError(422, f"payments: {param} must be someone else, not yourself")
    return user


def _transfer(w: Any, sender: str, receiver: str, amount: float, description: str) -> int:
    users = w.table(A, "users")
    users[sender]["balance"] = round(users[sender]["balance"] - amount, 2)
    users[receiver]["balance"] = round(users[receiver]["balance"] + amount, 2)
    tid = w.new_id(A, "transactions")
    w.table(A, "transactions")[tid] = {
        "transaction_id": tid,
        "sender": sender,
        "receiver": receiver,
        "amount": round(amount, 2),
        "description": description,
        "created_at": w.now_iso(),
    }
    return tid


@APP.api
def show_account(w: Any, access_token: Token) -> dict:
    """Show your account. Returns: {"email", "name", "balance"}."""
    return w.table(A, "users")[w.user(A, access_token)]


@APP.api
def search_users(
    w: Any,
    query: Annotated[str, P("words to match in name or email")],
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """Search users by name or email. Returns: a list of {"email", "name"}."""
    q = query.lower().strip()
    rows = [
        {"email": u["email"], "name": u["name"]}
        for u in w.table(A, "users").values()
        if q in f"{u['name']} {u['email']}".lower()
    ]
    return page(rows, page_index, page_limit)


@APP.api
def show_friends(w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5) -> list:
    """List your payment friends. Returns: a list of {"email", "name"}."""
    me = w.user(A, access_token)
    users = w.table(A, "users")
    rows = [
        {"email": f["friend"], "name": users[f["friend"]]["name"]}
        for f in w.table(A, "friends").values()
        if f["user"] == me
    ]
    return page(rows, page_index, page_limit)


@APP.api
def add_friend(w: Any, access_token: Token, email: Email) -> dict:
    """Add a user as a friend (409 if already one). Returns: {"email", "friend": true}."""
    me = w.user(A, access_token)
    _other(w, me, email, "email")
    if any(f["user"] == me and f["friend"] == email for f in w.table(A, "friends").values()):
        raise ApiError(409, f"payments: {email!r} is already your friend")
    w.table(A, "friends")[w.new_id(A, "friends")] = {"user": me, "friend": email}
    return {"email": email, "friend": True}


@APP.api
def remove_friend(w: Any, access_token: Token, email: Email) -> dict:
    """Remove a friend. Returns: {"email", "friend": false}."""
    me = w.user(A, access_token)
    friends = w.table(A, "friends")
    key = next((k for k, f in friends.items() if f["user"] == me and f["friend"] == email), None)
    if key is None:
        raise ApiError(404, f"payments: email {email!r} is not your friend")
    del friends[key]
    return {"email": email, "friend": False}


@APP.api
def show_transactions(
    w: Any,
    access_token: Token,
    direction: Annotated[str, P("which of your transactions", choices=("sent", "received", "all"))] = "all",
    user_email: Annotated[str | None, P("only transactions with this user")] = None,
    min_created_at: Annotated[str | None, P("only transactions at or after this ISO date/time")] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """List your transactions, newest first.

    Returns: a list of {"transaction_id", "sender", "receiver", "amount", "description", "created_at"}.
    """
    me = w.user(A, access_token)
    rows = [
        t
        for t in w.table(A, "transactions").values()
        if (
            direction in ("sent", "all")
            and t["sender"] == me
            or direction in ("received", "all")
            and t["receiver"] == me
        )
        and (user_email is None or user_email in (t["sender"], t["receiver"]))
        and (min_created_at is None or t["created_at"] >= min_created_at)
    ]
    rows.sort(key=lambda t: (t["created_at"], t["transaction_id"]), reverse=True)
    return page(rows, page_index, page_limit)


@APP.api
def send_money(
    w: Any, access_token: Token, receiver_email: Email, amount: Amount, description: Note = ""
) -> dict:
    """Send money from your balance (409 if the balance is too low). Returns: {"transaction_id", "balance"}."""
    me = w.user(A, access_token)
    _other(w, me, receiver_email, "receiver_email")
    if w.table(A, "users")[me]["balance"] < amount:
        raise ApiError(409, f"payments: amount {amount:.2f} exceeds your balance; use add_to_balance first")
    tid = _transfer(w, me, receiver_email, amount, description)
    return {"transaction_id": tid, "balance": w.table(A, "users")[me]["balance"]}


@APP.api
def add_to_balance(
    w: Any,
    access_token: Token,
    amount: Amount,
    payment_card_id: Annotated[int, P("ID of a supervisor payment card", ge=1)],
) -> dict:
    """Move money from one of your payment cards to your balance. Returns: {"balance"}."""
    me = w.user(A, access_token)
    card = w.db["supervisor"]["payment_cards"].get(payment_card_id)
    if card is None:
        raise ApiError(404, f"payments: no payment card with payment_card_id {payment_card_id}")
    if card["balance"] < amount:
        raise ApiError(409, f"payments: card {payment_card_id} has only {card['balance']:.2f} available")
    card["balance"] = round(card["balance"] - amount, 2)
    user = w.table(A, "users")[me]
    user["balance"] = round(user["balance"] + amount, 2)
    return {"balance": user["balance"]}


@APP.api
def request_money(
    w: Any, access_token: Token, user_email: Email, amount: Amount, description: Note = ""
) -> dict:
    """Ask another user to pay you. Returns: {"payment_request_id"}."""
    me = w.user(A, access_token)
    _other(w, me, user_email, "user_email")
    rid = w.new_id(A, "requests")
    w.table(A, "requests")[rid] = {
        "payment_request_id": rid,
        "requester": me,
        "payer": user_email,
        "amount": round(amount, 2),
        "description": description,
        "status": "pending",
        "created_at": w.now_iso(),
    }
    return {"payment_request_id": rid}


@APP.api
def show_payment_requests(
    w: Any,
    access_token: Token,
    direction: Annotated[
        str, P("'received': others ask you to pay; 'sent': you asked", choices=("received", "sent"))
    ] = "received",
    status: Annotated[str | None, P("filter by status", choices=("pending", "approved", "denied"))] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """List payment requests, oldest first.

    Returns: a list of {"payment_request_id", "requester", "payer", "amount", "description", "status", "created_at"}.
    """
    me = w.user(A, access_token)
    who = "payer" if direction == "received" else "requester"
    rows = [
        r
        for r in w.table(A, "requests").values()
        if r[who] == me and (status is None or r["status"] == status)
    ]
    return page(rows, page_index, page_limit)


def _pending_for_me(w: Any, me: str, request_id: int) -> dict:
    r = w.get(A, "requests", request_id, "payment request")
    if r["payer"] != me:
        raise ApiError(403, f"payments: payment_request_id {request_id} is not addressed to you")
    if r["status"] != "pending":
        raise ApiError(409, f"payments: payment_request_id {request_id} is already {r['status']}")
    return r


@APP.api
def approve_payment_request(w: Any, access_token: Token, payment_request_id: RequestId) -> dict:
    """Pay a pending request addressed to you from your balance. Returns: {"transaction_id", "balance"}."""
    me = w.user(A, access_token)
    r = _pending_for_me(w, me, payment_request_id)
    if w.table(A, "users")[me]["balance"] < r["amount"]:
        raise ApiError(409, f"payments: request amount {r['amount']:.2f} exceeds your balance")
    r["status"] = "approved"
    tid = _transfer(w, me, r["requester"], r["amount"], r["description"])
    return {"transaction_id": tid, "balance": w.table(A, "users")[me]["balance"]}


@APP.api
def deny_payment_request(w: Any, access_token: Token, payment_request_id: RequestId) -> dict:
    """Deny a pending request addressed to you. Returns: {"payment_request_id", "status"}."""
    me = w.user(A, access_token)
    _pending_for_me(w, me, payment_request_id)["status"] = "denied"
    return {"payment_request_id": payment_request_id, "status": "denied"}

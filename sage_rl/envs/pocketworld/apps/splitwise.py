"""splitwise: shared expenses in groups, balances and settlements."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, PageIndex, PageLimit, Token, add_auth_apis, page

APP = App("splitwise", "Shared expenses: groups, expenses split equally, balances, settlements.")
add_auth_apis(APP)
A = "splitwise"

GroupId = Annotated[int, P("ID of the group", ge=1)]


def _group(w: Any, me: str, group_id: int) -> dict:
    g = w.get(A, "groups", group_id, "group")
    if me not in g["members"]:
        raise ApiError(404, f"splitwise: no group with group_id {group_id} that you belong to")
    return g


def owed_between(w: Any, group_id: int, me: str, other: str) -> float:
    """How much ``other`` owes ``me`` in a group (negative: ``me`` owes ``other``), after settlements."""
    total = 0.0
    for e in w.table(A, "expenses").values():
        if e["group_id"] != group_id:
            continue
        share = e["amount"] / len(e["split_among"])
        if e["paid_by"] == me and other in e["split_among"]:
            total += share
        elif e["paid_by"] == other and me in e["split_among"]:
            total -= share
    for s in w.table(A, "settlements").values():
        if s["group_id"] == group_id and (s["payer"], s["payee"]) == (other, me):
            total -= s["amount"]
        elif s["group_id"] == group_id and (s["payer"], s["payee"]) == (me, other):
            total += s["amount"]
    return round(total, 2)


@APP.api
def show_groups(w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5) -> list:
    """List the groups you belong to. Returns: a list of {"group_id", "name", "members"}."""
    me = w.user(A, access_token)
    return page([g for g in w.table(A, "groups").values() if me in g["members"]], page_index, page_limit)


@APP.api
def show_expenses(
    w: Any, access_token: Token, group_id: GroupId, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list:
    """List a group's expenses, oldest first.

    Returns: a list of {"expense_id", "group_id", "description", "amount", "paid_by", "split_among", "created_at"}.
    """
    _group(w, w.user(A, access_token), group_id)
    return page(
        [e for e in w.table(A, "expenses").values() if e["group_id"] == group_id], page_index, page_limit
    )


@APP.api
def add_expense(
    w: Any,
    access_token: Token,
    group_id: GroupId,
    description: Annotated[str, P("what it was for", min_len=1)],
    amount: Annotated[float, P("total amount in dollars", ge=0.01, le=100000)],
    split_among: Annotated[
        list[str] | None, P("member emails sharing it equally (default: all members)")
    ] = None,
    paid_by: Annotated[str | None, P("member email who paid (default: you)")] = None,
) -> dict:
    """Add an expense split equally. Returns: {"expense_id"}."""
    me = w.user(A, access_token)
    g = _group(w, me, group_id)
    split = list(g["members"]) if split_among is None else split_among
    payer = me if paid_by is None else paid_by
    for who, param in [(e, "split_among") for e in split] + [(payer, "paid_by")]:
        if who not in g["members"]:
            raise ApiError(422, f"splitwise: {param} has {who!r}, who is not a member of group_id {group_id}")
    if not split:
        raise ApiError(422, "splitwise: split_among must not be empty")
    eid = w.new_id(A, "expenses")
    w.table(A, "expenses")[eid] = {
        "expense_id": eid, "group_id": group_id, "description": description, "amount": round(amount, 2),
        "paid_by": payer, "split_among": sorted(set(split)), "created_at": w.now_iso(),
    }  # fmt: skip
    return {"expense_id": eid}


@APP.api
def delete_expense(
    w: Any, access_token: Token, expense_id: Annotated[int, P("ID of the expense", ge=1)]
) -> dict:
    """Delete an expense. Returns: {"message"}."""
    me = w.user(A, access_token)
    e = w.get(A, "expenses", expense_id, "expense")
    _group(w, me, e["group_id"])
    del w.table(A, "expenses")[expense_id]
    return {"message": f"expense {expense_id} deleted"}


@APP.api
def show_balance_with(
    w: Any, access_token: Token, group_id: GroupId, email: Annotated[str, P("another member's email")]
) -> dict:
    """How much a member owes you in a group, after settlements (negative: you owe them).

    Returns: {"group_id", "email", "owes_you"}.
    """
    me = w.user(A, access_token)
    g = _group(w, me, group_id)
    if email not in g["members"] or email == me:
        raise ApiError(422, f"splitwise: email {email!r} is not another member of group_id {group_id}")
    return {"group_id": group_id, "email": email, "owes_you": owed_between(w, group_id, me, email)}


@APP.api
def record_payment(
    w: Any, access_token: Token, group_id: GroupId, payee_email: Annotated[str, P("member you paid")],
    amount: Annotated[float, P("amount you paid them", ge=0.01)],
) -> dict:  # fmt: skip
    """Record that you paid a member back (a settlement). Returns: {"settlement_id"}."""
    me = w.user(A, access_token)
    g = _group(w, me, group_id)
    if payee_email not in g["members"] or payee_email == me:
        raise ApiError(
            422, f"splitwise: payee_email {payee_email!r} is not another member of group_id {group_id}"
        )
    sid = w.new_id(A, "settlements")
    w.table(A, "settlements")[sid] = {
        "settlement_id": sid, "group_id": group_id, "payer": me, "payee": payee_email, "amount": round(amount, 2),
        "created_at": w.now_iso(),
    }  # fmt: skip
    return {"settlement_id": sid}


@APP.api
def show_settlements(
    w: Any, access_token: Token, group_id: GroupId, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list:
    """List a group's settlements. Returns: a list of {"settlement_id", "payer", "payee", "amount", "created_at"}."""
    _group(w, w.user(A, access_token), group_id)
    return page(
        [s for s in w.table(A, "settlements").values() if s["group_id"] == group_id], page_index, page_limit
    )

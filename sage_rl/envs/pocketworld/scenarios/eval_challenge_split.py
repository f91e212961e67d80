"""test_challenge templates over splitwise (shared expenses), alone and with payments."""

from __future__ import annotations

from sage_rl.envs.pocketworld.apps.splitwise import owed_between
from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template


class _Shim:
    """Just enough of a World for ``owed_between`` to read a ``db``."""

    def __init__(self, db):
        self.db = db

    def table(self, app, name):
        return self.db[app][name]


def _group(db, name):
    return next(g for g in db["splitwise"]["groups"].values() if g["name"] == name)


def _owed(db, group, other):
    return owed_between(_Shim(db), _group(db, group)["group_id"], h.me(db), other)


# ---------------------------------------------------------------------------- how much someone owes me


def _ow_sample(rng, w):
    pairs = [(g["name"], m) for g in w.db["splitwise"]["groups"].values() for m in g["members"]
             if m != h.me(w.db) and _owed(w.db, g["name"], m) > 0]  # fmt: skip
    group, email = h.pick(rng, sorted(pairs), "someone who owes me")
    return {"group": group, "name": w.db["splitwise"]["users"][email]["name"]}


def _ow_expect(db, p):
    email = next(e for e, u in db["splitwise"]["users"].items() if u["name"] == p["name"])
    return Expect(answer=_owed(db, p["group"], email))


OWED_BY = Template(
    name="splitwise_owed_by",
    split="test_challenge",
    apps=("splitwise",),
    difficulty=1,
    phrasings=(
        "How much does {name} owe me in the '{group}' group on splitwise?",
        "On splitwise, what is {name}'s outstanding debt to me in '{group}'?",
        "Check splitwise: how much money should {name} pay me back in the '{group}' group?",
    ),
    sample=_ow_sample,
    expect=_ow_expect,
    skill_source='''
def splitwise_group(group_name: str) -> dict:
    """Return my splitwise group named `group_name`."""
    token = login_to("splitwise")
    return next(g for g in fetch_all(apis.splitwise.show_groups, access_token=token) if g["name"] == group_name)


def owed_by(name: str, group_name: str) -> float:
    """Return how much the member called `name` owes me in splitwise group `group_name`."""
    token = login_to("splitwise")
    group = splitwise_group(group_name)
    email = next(u["email"] for u in fetch_all(apis.payments.search_users, query=name) if u["name"] == name)
    return apis.splitwise.show_balance_with(access_token=token, group_id=group["group_id"], email=email)["owes_you"]
''',
    skill_names=("splitwise_group", "owed_by"),
    call="apis.supervisor.complete_task(answer=owed_by({name!r}, {group!r}))",
)

# ---------------------------------------------------------------------------- add an equal-split expense


def _add_sample(rng, w):
    return {"group": rng.choice(sorted(g["name"] for g in w.db["splitwise"]["groups"].values())),
            "amount": rng.randrange(20, 200), "description": rng.choice(("Takeout", "Cleaning service", "Board games"))}  # fmt: skip


def _add_expect(db, p):
    g, old, me = _group(db, p["group"]), set(db["splitwise"]["expenses"]), h.me(db)

    def added(f):
        new = [e for k, e in f["splitwise"]["expenses"].items() if k not in old]
        return (
            len(new) == 1
            and new[0]["group_id"] == g["group_id"]
            and abs(new[0]["amount"] - p["amount"]) < 0.005
            and new[0]["paid_by"] == me
            and sorted(new[0]["split_among"]) == sorted(g["members"])
            and new[0]["description"] == p["description"]
        )

    return Expect(
        requires=(Require("the expense was added", added),),
        allow=(Allow("splitwise", "expenses", lambda e: e["group_id"] == g["group_id"]),),
    )


ADD_EXPENSE = Template(
    name="splitwise_add_expense",
    split="test_challenge",
    apps=("splitwise",),
    difficulty=1,
    phrasings=(
        "Add a ${amount} expense called '{description}' to my '{group}' group on splitwise, paid by me and split equally among everyone.",
        "On splitwise, record that I paid ${amount} for '{description}' in '{group}', shared equally by all members.",
        "Log '{description}' (${amount}, I paid) in the splitwise group '{group}', split evenly across the group.",
    ),
    sample=_add_sample,
    expect=_add_expect,
    skill_source='''
def splitwise_group(group_name: str) -> dict:
    """Return my splitwise group named `group_name`."""
    token = login_to("splitwise")
    return next(g for g in fetch_all(apis.splitwise.show_groups, access_token=token) if g["name"] == group_name)


def add_equal_expense(group_name: str, description: str, amount: float) -> int:
    """Add an expense I paid, split equally among all members of `group_name`; return its id."""
    token = login_to("splitwise")
    group = splitwise_group(group_name)
    return apis.splitwise.add_expense(access_token=token, group_id=group["group_id"], description=description, amount=amount)["expense_id"]
''',
    skill_names=("splitwise_group", "add_equal_expense"),
    call="add_equal_expense({group!r}, {description!r}, {amount})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- settle debts via payments


def _debts(db, group):
    g = _group(db, group)
    return {m: -_owed(db, group, m) for m in g["members"] if m != h.me(db) and _owed(db, group, m) < 0}


def _settle_sample(rng, w):
    ok = [g["name"] for g in w.db["splitwise"]["groups"].values() if _debts(w.db, g["name"])]
    group = h.pick(rng, sorted(ok), "group where I owe")
    if sum(_debts(w.db, group).values()) > w.db["payments"]["users"][h.me(w.db)]["balance"]:
        raise h.Unsuitable("balance too low")
    return {"group": group}


def _settle_expect(db, p):
    debts, me, gid = _debts(db, p["group"]), h.me(db), _group(db, p["group"])["group_id"]
    old_tx, old_st = set(db["payments"]["transactions"]), set(db["splitwise"]["settlements"])

    def paid(f):
        new = [t for k, t in f["payments"]["transactions"].items() if k not in old_tx]
        return sorted((t["receiver"], round(t["amount"], 2)) for t in new) == sorted(
            (m, round(a, 2)) for m, a in debts.items()
        )

    def recorded(f):
        new = [s for k, s in f["splitwise"]["settlements"].items() if k not in old_st]
        return sorted((s["payee"], round(s["amount"], 2)) for s in new if s["group_id"] == gid) == sorted(
            (m, round(a, 2)) for m, a in debts.items()) and len(new) == len(debts)  # fmt: skip

    return Expect(
        requires=(
            Require("each debt paid on payments", paid),
            Require("each payment recorded on splitwise", recorded),
        ),
        allow=(
            Allow("payments", "transactions", lambda t: t["sender"] == me and t["receiver"] in debts),
            Allow("payments", "users", lambda u: u["email"] in set(debts) | {me}),
            Allow("splitwise", "settlements", lambda s: s["group_id"] == gid),
        ),
    )


SETTLE_UP = Template(
    name="splitwise_settle_with_payments",
    split="test_challenge",
    apps=("splitwise", "payments"),
    difficulty=3,
    phrasings=(
        "Pay back everyone I owe money to in the '{group}' splitwise group using payments, and record each payment on splitwise.",
        "Settle my debts in '{group}': send each person I owe the exact amount on payments and log it as a payment in splitwise.",
        "For every member of '{group}' that I owe on splitwise, pay them through the payments app and record the settlement.",
    ),
    sample=_settle_sample,
    expect=_settle_expect,
    skill_source='''
def splitwise_group(group_name: str) -> dict:
    """Return my splitwise group named `group_name`."""
    token = login_to("splitwise")
    return next(g for g in fetch_all(apis.splitwise.show_groups, access_token=token) if g["name"] == group_name)


def settle_group_debts(group_name: str) -> int:
    """Pay (via payments) and record (on splitwise) every debt I have in group `group_name`; return how many."""
    sw_token, pay_token = login_to("splitwise"), login_to("payments")
    me = apis.supervisor.show_profile()["email"]
    group = splitwise_group(group_name)
    settled = 0
    for member in group["members"]:
        if member == me:
            continue
        owes_me = apis.splitwise.show_balance_with(access_token=sw_token, group_id=group["group_id"], email=member)["owes_you"]
        if owes_me < 0:
            apis.payments.send_money(access_token=pay_token, receiver_email=member, amount=-owes_me, description=group_name)
            apis.splitwise.record_payment(access_token=sw_token, group_id=group["group_id"], payee_email=member, amount=-owes_me)
            settled += 1
    return settled
''',
    skill_names=("splitwise_group", "settle_group_debts"),
    call="settle_group_debts({group!r})\napis.supervisor.complete_task()",
)

TEMPLATES = (OWED_BY, ADD_EXPENSE, SETTLE_UP)

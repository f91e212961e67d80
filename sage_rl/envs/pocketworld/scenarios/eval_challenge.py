"""test_challenge templates: each uses an app no train template uses (files, shopping, splitwise)."""

from __future__ import annotations

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template
from sage_rl.envs.pocketworld.scenarios.train_organize import notes


def _files(db):
    return list(db["files"]["files"].values())


# ---------------------------------------------------------------------------- count files by extension


def _count_ext(db, directory, ext):
    return sum(f["path"].startswith(directory + "/") and f["path"].endswith("." + ext) for f in _files(db))


def _ce_sample(rng, w):
    pairs = {
        (directory, f["path"].rsplit(".", 1)[1])
        for directory in ("/documents", "/photos", "/downloads", "/work")
        for f in _files(w.db)
        if f["path"].startswith(directory + "/")
    }
    directory, ext = h.spread(rng, h.COUNTS, {pair: _count_ext(w.db, *pair) for pair in pairs})
    return {"directory": directory, "ext": ext}


COUNT_EXT = Template(
    name="files_count_extension",
    split="test_challenge",
    apps=("files",),
    difficulty=1,
    phrasings=(
        "How many .{ext} files are there in {directory}, including its subfolders?",
        "Count the .{ext} files anywhere under my {directory} folder.",
        "What's the number of files ending in .{ext} inside {directory} (recursively)?",
    ),
    sample=_ce_sample,
    expect=lambda db, p: Expect(answer=_count_ext(db, p["directory"], p["ext"])),
    skill_source='''
def count_files(directory: str, extension: str) -> int:
    """Return how many files with `extension` are under `directory`, recursively."""
    token = login_to("files")
    return len(fetch_all(apis.files.search_files, access_token=token, directory=directory, extension=extension))
''',
    skill_names=("count_files",),
    call="apis.supervisor.complete_task(answer=count_files({directory!r}, {ext!r}))",
)

# ---------------------------------------------------------------------------- move files by extension


def _direct(db, ext):
    return [
        f
        for f in _files(db)
        if f["path"].startswith("/downloads/") and f["path"].count("/") == 2 and f["path"].endswith("." + ext)
    ]


def _mv_sample(rng, w):
    ext = h.pick(rng, [e for e in ("pdf", "jpg", "csv", "zip") if _direct(w.db, e)], "extension in downloads")
    return {
        "ext": ext,
        "dest": {
            "pdf": "/documents/pdfs",
            "jpg": "/photos/downloaded",
            "csv": "/work/data",
            "zip": "/archive",
        }[ext],
    }


def _mv_expect(db, p):
    want = {f["file_id"]: f"{p['dest']}/{f['path'].rsplit('/', 1)[1]}" for f in _direct(db, p["ext"])}
    return Expect(
        requires=(
            Require(
                "files moved to the destination",
                lambda f: all(f["files"]["files"][k]["path"] == v for k, v in want.items()),
            ),
        ),
        allow=(Allow("files", "files", lambda f: f["file_id"] in want),),
    )


MOVE_EXT = Template(
    name="files_move_downloads",
    split="test_challenge",
    apps=("files",),
    difficulty=2,
    phrasings=(
        "Move all .{ext} files that sit directly in /downloads to {dest}, keeping their file names.",
        "Tidy up /downloads: every .{ext} file there (not in subfolders) should go to {dest} with the same name.",
        "Relocate the .{ext} files in /downloads (top level only) into {dest}; don't rename them.",
    ),
    sample=_mv_sample,
    expect=_mv_expect,
    skill_source='''
def move_files(source_dir: str, extension: str, dest_dir: str) -> int:
    """Move files with `extension` directly inside `source_dir` to `dest_dir`, keeping names; return how many."""
    token = login_to("files")
    moved = 0
    for entry in fetch_all(apis.files.show_directory, access_token=token, path=source_dir):
        if entry["type"] == "file" and entry["name"].endswith("." + extension):
            apis.files.move_file(access_token=token, path=entry["path"], new_path=dest_dir + "/" + entry["name"])
            moved += 1
    return moved
''',
    skill_names=("move_files",),
    call="move_files('/downloads', {ext!r}, {dest!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- export a note to a file


def _exp_sample(rng, w):
    title = rng.choice(sorted(n["title"] for n in notes(w.db)))
    return {"title": title, "path": "/documents/notes/" + title.lower().replace(" ", "_") + ".txt"}


def _exp_expect(db, p):
    content = next(n["content"] for n in notes(db) if n["title"] == p["title"])

    def saved(f):
        return [x["content"] for x in _files(f) if x["path"] == p["path"]] == [content]

    return Expect(
        requires=(Require("the file holds the note's content", saved),),
        allow=(Allow("files", "files", lambda f: f["path"] == p["path"]),),
    )


EXPORT_NOTE = Template(
    name="files_export_note",
    split="test_challenge",
    apps=("notes", "files"),
    difficulty=2,
    phrasings=(
        "Save the content of my note '{title}' to a new file at {path}.",
        "Export my '{title}' note: create the file {path} containing exactly the note's text.",
        "Write the text of the note titled '{title}' into a new file {path}.",
    ),
    sample=_exp_sample,
    expect=_exp_expect,
    skill_source='''
def export_note_to_file(note_title: str, path: str) -> int:
    """Create file `path` holding the content of my note titled `note_title`; return the file_id."""
    notes_token, files_token = login_to("notes"), login_to("files")
    summary = next(n for n in fetch_all(apis.notes.show_notes, access_token=notes_token, query=note_title) if n["title"] == note_title)
    content = apis.notes.show_note(access_token=notes_token, note_id=summary["note_id"])["content"]
    return apis.files.create_file(access_token=files_token, path=path, content=content)["file_id"]
''',
    skill_names=("export_note_to_file",),
    call="export_note_to_file({title!r}, {path!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- buy wishlist items under a price


def _wish(db, max_price):
    prods = db["shopping"]["products"]
    ids = [r["product_id"] for r in db["shopping"]["wishlist"].values() if r["user"] == h.me(db)]
    return sorted(i for i in ids if prods[i]["stock"] > 0 and prods[i]["price"] < max_price)


def _buy_sample(rng, w):
    max_price = rng.choice((30, 50, 80))
    card = w.db["supervisor"]["payment_cards"][1]
    if (
        not _wish(w.db, max_price)
        or sum(w.db["shopping"]["products"][i]["price"] for i in _wish(w.db, max_price)) > card["balance"]
    ):
        raise h.Unsuitable("nothing to buy")
    return {"max_price": max_price, "card": card["card_name"]}


def _buy_expect(db, p):
    ids, me, old = _wish(db, p["max_price"]), h.me(db), set(db["shopping"]["orders"])
    card_id = next(k for k, c in db["supervisor"]["payment_cards"].items() if c["card_name"] == p["card"])

    def bought(f):
        new = [o for k, o in f["shopping"]["orders"].items() if k not in old]
        got = sorted((i["product_id"], i["quantity"]) for o in new for i in o["items"])
        ok = all(o["payment_card_id"] == card_id and o["address_id"] == 1 for o in new)
        return ok and got == [(i, 1) for i in ids]

    return Expect(
        requires=(Require("one of each cheap in-stock wishlist item ordered with the card to home", bought),),
        allow=(
            Allow("shopping", "orders", lambda o: o["user"] == me),
            Allow("shopping", "cart", lambda c: c["product_id"] in ids),
            Allow("shopping", "products", lambda x: x["product_id"] in ids),
            Allow("supervisor", "payment_cards", lambda c: c["card_id"] == card_id),
        ),
    )


BUY_WISHLIST = Template(
    name="shopping_buy_wishlist",
    split="test_challenge",
    apps=("shopping",),
    difficulty=3,
    phrasings=(
        "Buy one of every in-stock item on my shopping wishlist that costs less than ${max_price}, paying with my {card} card and shipping to my home address.",
        "Order each wishlist product under ${max_price} that is in stock (quantity 1), charge my {card} card, deliver to home.",
        "Purchase the in-stock items from my wishlist priced below ${max_price}, one each, with the {card} card, to my home address.",
    ),
    sample=_buy_sample,
    expect=_buy_expect,
    skill_source='''
def buy_cheap_wishlist_items(max_price: float, card_name: str, address_name: str = "home") -> int:
    """Order one of each in-stock wishlist item cheaper than `max_price` with card `card_name`; return the order_id."""
    token = login_to("shopping")
    card = next(c for c in apis.supervisor.show_payment_cards() if c["card_name"] == card_name)
    address = next(a for a in apis.supervisor.show_addresses() if a["name"] == address_name)
    for item in fetch_all(apis.shopping.show_wishlist, access_token=token):
        if item["stock"] > 0 and item["price"] < max_price:
            apis.shopping.add_to_cart(access_token=token, product_id=item["product_id"], quantity=1)
    order = apis.shopping.checkout(access_token=token, payment_card_id=card["card_id"], address_id=address["address_id"])
    return order["order_id"]
''',
    skill_names=("buy_cheap_wishlist_items",),
    call="buy_cheap_wishlist_items({max_price}, {card!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- total of orders by status


def _orders_total(db, status):
    got = [
        o["total"]
        for o in db["shopping"]["orders"].values()
        if o["user"] == h.me(db) and o["status"] == status
    ]
    if not got:
        raise h.Unsuitable("no orders with that status")
    return round(sum(got), 2)


def _ot_sample(rng, w):
    status = rng.choice(("delivered", "placed", "cancelled"))
    _orders_total(w.db, status)
    return {"status": status}


ORDERS_TOTAL = Template(
    name="shopping_orders_total",
    split="test_challenge",
    apps=("shopping",),
    difficulty=1,
    phrasings=(
        "What is the total value of all my {status} shopping orders?",
        "Add up the totals of every order of mine with status '{status}'. How much is it?",
        "How much money do my {status} orders come to in total?",
    ),
    sample=_ot_sample,
    expect=lambda db, p: Expect(answer=_orders_total(db, p["status"])),
    skill_source='''
def orders_total(status: str) -> float:
    """Return the summed total of my shopping orders with the given status."""
    token = login_to("shopping")
    return round(sum(o["total"] for o in fetch_all(apis.shopping.show_orders, access_token=token, status=status)), 2)
''',
    skill_names=("orders_total",),
    call="apis.supervisor.complete_task(answer=orders_total({status!r}))",
)

# ---------------------------------------------------------------------------- review delivered products


def _unreviewed(db):
    me = h.me(db)
    done = {r["product_id"] for r in db["shopping"]["reviews"].values() if r["user"] == me}
    got = {
        i["product_id"]
        for o in db["shopping"]["orders"].values()
        if o["user"] == me and o["status"] == "delivered"
        for i in o["items"]
    }
    return sorted(got - done)


def _rev_sample(rng, w):
    h.pick(rng, _unreviewed(w.db), "unreviewed product")
    return {"rating": rng.randrange(3, 6)}


def _rev_expect(db, p):
    ids, me = set(_unreviewed(db)), h.me(db)

    def reviewed(f):
        rows = [r for r in f["shopping"]["reviews"].values() if r["user"] == me and r["product_id"] in ids]
        return sorted(r["product_id"] for r in rows) == sorted(ids) and all(
            r["rating"] == p["rating"] for r in rows
        )

    return Expect(
        requires=(Require("each unreviewed delivered product has the rating", reviewed),),
        allow=(Allow("shopping", "reviews", lambda r: r["product_id"] in ids),),
    )


REVIEW_DELIVERED = Template(
    name="shopping_review_delivered",
    split="test_challenge",
    apps=("shopping",),
    difficulty=2,
    phrasings=(
        "Give a {rating}-star review to every product from my delivered orders that I haven't reviewed yet.",
        "Review all products I received (delivered orders) and have not reviewed, with {rating} stars each.",
        "Leave {rating}-star reviews for the delivered products I never reviewed.",
    ),
    sample=_rev_sample,
    expect=_rev_expect,
    skill_source='''
def review_delivered_products(rating: int) -> int:
    """Give `rating` stars to every product of my delivered orders that I have not reviewed; return how many."""
    token = login_to("shopping")
    reviewed = {r["product_id"] for r in fetch_all(apis.shopping.show_my_reviews, access_token=token)}
    todo = set()
    for order in fetch_all(apis.shopping.show_orders, access_token=token, status="delivered"):
        todo |= {i["product_id"] for i in order["items"]}
    for product_id in sorted(todo - reviewed):
        apis.shopping.write_review(access_token=token, product_id=product_id, rating=rating)
    return len(todo - reviewed)
''',
    skill_names=("review_delivered_products",),
    call="review_delivered_products({rating})\napis.supervisor.complete_task()",
)

TEMPLATES = (COUNT_EXT, MOVE_EXT, EXPORT_NOTE, BUY_WISHLIST, ORDERS_TOTAL, REVIEW_DELIVERED)

"""shopping: an online shop - products, cart, checkout with a supervisor card, orders, reviews, wishlist."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, PageIndex, PageLimit, Token, add_auth_apis, page

APP = App("shopping", "Online shop: search products, cart, checkout, orders, reviews, wishlist.")
add_auth_apis(APP)
A = "shopping"

ProductId = Annotated[int, P("ID of the product", ge=1)]
OrderId = Annotated[int, P("ID of the order", ge=1)]


def _product(w: Any, product_id: int) -> dict:
    return w.get(A, "products", product_id, "product")


def _mine(w: Any, table: str, me: str) -> dict:
    return {k: r for k, r in w.table(A, table).items() if r["user"] == me}


def _order(w: Any, me: str, order_id: int) -> dict:
    o = w.get(A, "orders", order_id, "order")
    if o["user"] != me:
        raise ApiError(404, f"shopping: no order with order_id {order_id}")
    return o


@APP.api
def search_products(
    w: Any,
    query: Annotated[str, P("words to match in the product name (empty: all)")] = "",
    category: Annotated[str | None, P("only this category")] = None,
    max_price: Annotated[float | None, P("only products at most this price", ge=0)] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """Search products, ordered by product_id. Returns: a list of {"product_id", "name", "category", "price", "rating", "stock"}."""
    q = query.lower().strip()
    rows = [
        p for p in w.table(A, "products").values()
        if q in p["name"].lower() and (category is None or p["category"] == category.lower())
        and (max_price is None or p["price"] <= max_price)
    ]  # fmt: skip
    return page(rows, page_index, page_limit)


@APP.api
def show_product(w: Any, product_id: ProductId) -> dict:
    """Show one product. Returns: {"product_id", "name", "category", "price", "rating", "stock"}."""
    return _product(w, product_id)


@APP.api
def show_cart(w: Any, access_token: Token) -> dict:
    """Show your cart. Returns: {"items": [{"product_id", "name", "price", "quantity"}], "total"}."""
    me = w.user(A, access_token)
    items = [
        {"product_id": c["product_id"], "name": _product(w, c["product_id"])["name"],
         "price": _product(w, c["product_id"])["price"], "quantity": c["quantity"]}
        for c in _mine(w, "cart", me).values()
    ]  # fmt: skip
    return {"items": items, "total": round(sum(i["price"] * i["quantity"] for i in items), 2)}


@APP.api
def add_to_cart(
    w: Any,
    access_token: Token,
    product_id: ProductId,
    quantity: Annotated[int, P("how many", ge=1, le=20)] = 1,
) -> dict:
    """Add a product to your cart (adds to the quantity if present; 409 if out of stock). Returns: {"product_id", "quantity"}."""
    me = w.user(A, access_token)
    p = _product(w, product_id)
    row = next((r for r in _mine(w, "cart", me).values() if r["product_id"] == product_id), None)
    total = quantity + (row["quantity"] if row else 0)
    if total > p["stock"]:
        raise ApiError(
            409, f"shopping: only {p['stock']} of product_id {product_id} in stock, asked for {total}"
        )
    if row is None:
        w.table(A, "cart")[w.new_id(A, "cart")] = {"user": me, "product_id": product_id, "quantity": quantity}
    else:
        row["quantity"] = total
    return {"product_id": product_id, "quantity": total}


@APP.api
def remove_from_cart(w: Any, access_token: Token, product_id: ProductId) -> dict:
    """Remove a product from your cart. Returns: {"message"}."""
    me = w.user(A, access_token)
    key = next((k for k, r in _mine(w, "cart", me).items() if r["product_id"] == product_id), None)
    if key is None:
        raise ApiError(404, f"shopping: product_id {product_id} is not in your cart")
    del w.table(A, "cart")[key]
    return {"message": f"removed product {product_id}"}


@APP.api
def checkout(
    w: Any,
    access_token: Token,
    payment_card_id: Annotated[int, P("ID of a supervisor payment card", ge=1)],
    address_id: Annotated[int, P("ID of a supervisor address", ge=1)],
) -> dict:
    """Order everything in your cart, charging a payment card. Returns: {"order_id", "total"}."""
    me = w.user(A, access_token)
    cart = _mine(w, "cart", me)
    card = w.db["supervisor"]["payment_cards"].get(payment_card_id)
    if not cart:
        raise ApiError(409, "shopping: your cart is empty")
    if card is None:
        raise ApiError(404, f"shopping: no payment card with payment_card_id {payment_card_id}")
    if address_id not in w.db["supervisor"]["addresses"]:
        raise ApiError(404, f"shopping: no address with address_id {address_id}")
    items = [
        {"product_id": c["product_id"], "name": _product(w, c["product_id"])["name"],
         "price": _product(w, c["product_id"])["price"], "quantity": c["quantity"]}
        for c in cart.values()
    ]  # fmt: skip
    total = round(sum(i["price"] * i["quantity"] for i in items), 2)
    if card["balance"] < total:
        raise ApiError(
            409, f"shopping: card {payment_card_id} has only {card['balance']:.2f}, total is {total:.2f}"
        )
    card["balance"] = round(card["balance"] - total, 2)
    for i in items:
        _product(w, i["product_id"])["stock"] -= i["quantity"]
    for k in cart:
        del w.table(A, "cart")[k]
    oid = w.new_id(A, "orders")
    w.table(A, "orders")[oid] = {
        "order_id": oid, "user": me, "items": items, "total": total, "status": "placed", "address_id": address_id,
        "payment_card_id": payment_card_id, "placed_at": w.now_iso(),
    }  # fmt: skip
    return {"order_id": oid, "total": total}


@APP.api
def show_orders(
    w: Any,
    access_token: Token,
    status: Annotated[str | None, P("filter by status", choices=("placed", "delivered", "cancelled"))] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """List your orders, newest first. Returns: a list of {"order_id", "items", "total", "status", "placed_at", ...}."""
    me = w.user(A, access_token)
    rows = [o for o in _mine(w, "orders", me).values() if status is None or o["status"] == status]
    rows.sort(key=lambda o: (o["placed_at"], o["order_id"]), reverse=True)
    return page([{k: v for k, v in o.items() if k != "user"} for o in rows], page_index, page_limit)


@APP.api
def cancel_order(w: Any, access_token: Token, order_id: OrderId) -> dict:
    """Cancel a placed (not yet delivered) order and refund the card. Returns: {"order_id", "status"}."""
    o = _order(w, w.user(A, access_token), order_id)
    if o["status"] != "placed":
        raise ApiError(409, f"shopping: order_id {order_id} is {o['status']} and cannot be cancelled")
    card = w.db["supervisor"]["payment_cards"][o["payment_card_id"]]
    card["balance"] = round(card["balance"] + o["total"], 2)
    o["status"] = "cancelled"
    return {"order_id": order_id, "status": "cancelled"}


@APP.api
def write_review(
    w: Any, access_token: Token, product_id: ProductId, rating: Annotated[int, P("stars", ge=1, le=5)],
    text: Annotated[str, P("review text")] = "",
) -> dict:  # fmt: skip
    """Review a product (409 if you already reviewed it). Returns: {"review_id"}."""
    me = w.user(A, access_token)
    _product(w, product_id)
    if any(r["product_id"] == product_id for r in _mine(w, "reviews", me).values()):
        raise ApiError(409, f"shopping: you already reviewed product_id {product_id}")
    rid = w.new_id(A, "reviews")
    w.table(A, "reviews")[rid] = {
        "user": me,
        "product_id": product_id,
        "rating": rating,
        "text": text,
        "created_at": w.now_iso(),
    }
    return {"review_id": rid}


@APP.api
def show_my_reviews(
    w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list:
    """List your reviews. Returns: a list of {"review_id", "product_id", "rating", "text", "created_at"}."""
    me = w.user(A, access_token)
    rows = [
        {"review_id": k, **{f: r[f] for f in ("product_id", "rating", "text", "created_at")}}
        for k, r in _mine(w, "reviews", me).items()
    ]
    return page(rows, page_index, page_limit)


@APP.api
def show_wishlist(w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5) -> list:
    """List your wishlist. Returns: a list of {"product_id", "name", "price", "stock"}."""
    me = w.user(A, access_token)
    rows = [
        {k: _product(w, r["product_id"])[k] for k in ("product_id", "name", "price", "stock")}
        for r in _mine(w, "wishlist", me).values()
    ]
    return page(rows, page_index, page_limit)


@APP.api
def add_to_wishlist(w: Any, access_token: Token, product_id: ProductId) -> dict:
    """Add a product to your wishlist (409 if present). Returns: {"product_id"}."""
    me = w.user(A, access_token)
    _product(w, product_id)
    if any(r["product_id"] == product_id for r in _mine(w, "wishlist", me).values()):
        raise ApiError(409, f"shopping: product_id {product_id} is already in your wishlist")
    w.table(A, "wishlist")[w.new_id(A, "wishlist")] = {"user": me, "product_id": product_id}
    return {"product_id": product_id}


@APP.api
def remove_from_wishlist(w: Any, access_token: Token, product_id: ProductId) -> dict:
    """Remove a product from your wishlist. Returns: {"message"}."""
    me = w.user(A, access_token)
    key = next((k for k, r in _mine(w, "wishlist", me).items() if r["product_id"] == product_id), None)
    if key is None:
        raise ApiError(404, f"shopping: product_id {product_id} is not in your wishlist")
    del w.table(A, "wishlist")[key]
    return {"message": f"removed product {product_id}"}

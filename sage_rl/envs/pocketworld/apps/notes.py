"""notes: a notes app with tags and pinning."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, PageIndex, PageLimit, Token, add_auth_apis, page

APP = App("notes", "Notes: titled text notes with tags; create, edit, pin, delete.")
add_auth_apis(APP)
A = "notes"

NoteId = Annotated[int, P("ID of the note", ge=1)]
Tags = Annotated[list[str], P("lower-case tags, e.g. ['recipes']")]


def _note(w: Any, me: str, note_id: int) -> dict:
    n = w.get(A, "notes", note_id, "note")
    if n["owner"] != me:
        raise ApiError(404, f"notes: no note with note_id {note_id}")
    return n


def _public(n: dict) -> dict:
    return {k: v for k, v in n.items() if k != "owner"}


@APP.api
def show_notes(
    w: Any,
    access_token: Token,
    query: Annotated[str, P("words to match in title or content (empty: all)")] = "",
    tag: Annotated[str | None, P("only notes with this tag")] = None,
    pinned: Annotated[bool | None, P("only pinned (true) or unpinned (false) notes")] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """List your notes, ordered by note_id (content omitted; use show_note).

    Returns: a list of {"note_id", "title", "tags", "pinned", "updated_at"}.
    """
    me = w.user(A, access_token)
    q = query.lower().strip()
    rows = [
        {k: n[k] for k in ("note_id", "title", "tags", "pinned", "updated_at")}
        for n in w.table(A, "notes").values()
        if n["owner"] == me and (not q or q in f"{n['title']} {n['content']}".lower())
        and (tag is None or tag in n["tags"]) and (pinned is None or n["pinned"] == pinned)
    ]  # fmt: skip
    return page(rows, page_index, page_limit)


@APP.api
def show_note(w: Any, access_token: Token, note_id: NoteId) -> dict:
    """Show one note. Returns: {"note_id", "title", "content", "tags", "pinned", "created_at", "updated_at"}."""
    return _public(_note(w, w.user(A, access_token), note_id))


@APP.api
def create_note(
    w: Any,
    access_token: Token,
    title: Annotated[str, P("title", min_len=1, max_len=120)],
    content: Annotated[str, P("text of the note")] = "",
    tags: Tags = [],  # noqa: B006
) -> dict:
    """Create a note. Returns: {"note_id"}."""
    me = w.user(A, access_token)
    nid = w.new_id(A, "notes")
    w.table(A, "notes")[nid] = {
        "note_id": nid, "owner": me, "title": title, "content": content, "tags": sorted({t.lower() for t in tags}),
        "pinned": False, "created_at": w.now_iso(), "updated_at": w.now_iso(),
    }  # fmt: skip
    return {"note_id": nid}


@APP.api
def update_note(
    w: Any,
    access_token: Token,
    note_id: NoteId,
    title: Annotated[str | None, P("new title")] = None,
    content: Annotated[str | None, P("new content")] = None,
    tags: Annotated[list[str] | None, P("new tags (replaces the old ones)")] = None,
) -> dict:
    """Change a note's title, content and/or tags. Returns: {"note_id"}."""
    n = _note(w, w.user(A, access_token), note_id)
    if title is not None:
        n["title"] = title
    if content is not None:
        n["content"] = content
    if tags is not None:
        n["tags"] = sorted({t.lower() for t in tags})
    n["updated_at"] = w.now_iso()
    return {"note_id": note_id}


@APP.api
def pin_note(
    w: Any,
    access_token: Token,
    note_id: NoteId,
    pinned: Annotated[bool, P("pin (true) or unpin (false)")] = True,
) -> dict:
    """Pin or unpin a note. Returns: {"note_id", "pinned"}."""
    _note(w, w.user(A, access_token), note_id)["pinned"] = pinned
    return {"note_id": note_id, "pinned": pinned}


@APP.api
def delete_note(w: Any, access_token: Token, note_id: NoteId) -> dict:
    """Delete a note. Returns: {"message"}."""
    _note(w, w.user(A, access_token), note_id)
    del w.table(A, "notes")[note_id]
    return {"message": f"note {note_id} deleted"}

"""todo: to-do lists with tasks, due dates and priorities."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, PageIndex, PageLimit, Token, add_auth_apis, page

APP = App("todo", "To-do lists: lists of tasks with due dates and priorities; add, complete, delete.")
add_auth_apis(APP)
A = "todo"

ListId = Annotated[int, P("ID of the to-do list", ge=1)]
ItemId = Annotated[int, P("ID of the task", ge=1)]
Date = Annotated[str | None, P("due date as YYYY-MM-DD")]


def _list(w: Any, me: str, list_id: int) -> dict:
    lst = w.get(A, "lists", list_id, "to-do list")
    if lst["owner"] != me:
        raise ApiError(404, f"todo: no to-do list with list_id {list_id}")
    return lst


def _item(w: Any, me: str, task_id: int) -> dict:
    it = w.get(A, "items", task_id, "task")
    _list(w, me, it["list_id"])
    return it


def _check_date(d: str | None, param: str) -> None:
    parts = (d or "0000-00-00").split("-")
    if d is not None and not (len(parts) == 3 and all(p.isdigit() for p in parts) and len(d) == 10):
        raise ApiError(422, f"todo: parameter {param!r} must be YYYY-MM-DD, got {d!r}")


@APP.api
def show_lists(w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5) -> list:
    """List your to-do lists. Returns: a list of {"list_id", "name"}."""
    me = w.user(A, access_token)
    rows = [
        {"list_id": k, "name": lst["name"]} for k, lst in w.table(A, "lists").items() if lst["owner"] == me
    ]
    return page(rows, page_index, page_limit)


@APP.api
def create_list(
    w: Any, access_token: Token, name: Annotated[str, P("name of the list", min_len=1, max_len=80)]
) -> dict:
    """Create a to-do list (409 if the name is taken). Returns: {"list_id"}."""
    me = w.user(A, access_token)
    if any(lst["owner"] == me and lst["name"] == name for lst in w.table(A, "lists").values()):
        raise ApiError(409, f"todo: you already have a list with name {name!r}")
    lid = w.new_id(A, "lists")
    w.table(A, "lists")[lid] = {"owner": me, "name": name}
    return {"list_id": lid}


@APP.api
def show_tasks(
    w: Any,
    access_token: Token,
    list_id: ListId,
    completed: Annotated[bool | None, P("only done (true) or open (false) tasks")] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """List the tasks of a list, ordered by task_id.

    Returns: a list of {"task_id", "list_id", "title", "due_date", "priority", "completed", "completed_at"}.
    """
    me = w.user(A, access_token)
    _list(w, me, list_id)
    rows = [
        t
        for t in w.table(A, "items").values()
        if t["list_id"] == list_id and (completed is None or t["completed"] == completed)
    ]
    return page(rows, page_index, page_limit)


@APP.api
def add_task(
    w: Any,
    access_token: Token,
    list_id: ListId,
    title: Annotated[str, P("what to do", min_len=1, max_len=200)],
    due_date: Date = None,
    priority: Annotated[str, P("priority", choices=("low", "medium", "high"))] = "medium",
) -> dict:
    """Add an open task to a list. Returns: {"task_id"}."""
    me = w.user(A, access_token)
    _list(w, me, list_id)
    _check_date(due_date, "due_date")
    tid = w.new_id(A, "items")
    w.table(A, "items")[tid] = {
        "task_id": tid, "list_id": list_id, "title": title, "due_date": due_date, "priority": priority,
        "completed": False, "completed_at": None,
    }  # fmt: skip
    return {"task_id": tid}


@APP.api
def mark_task_done(w: Any, access_token: Token, task_id: ItemId) -> dict:
    """Mark a task done (409 if it already is). Returns: {"task_id", "completed": true}."""
    it = _item(w, w.user(A, access_token), task_id)
    if it["completed"]:
        raise ApiError(409, f"todo: task_id {task_id} is already done")
    it.update(completed=True, completed_at=w.now_iso())
    return {"task_id": task_id, "completed": True}


@APP.api
def reopen_task(w: Any, access_token: Token, task_id: ItemId) -> dict:
    """Mark a done task open again. Returns: {"task_id", "completed": false}."""
    it = _item(w, w.user(A, access_token), task_id)
    it.update(completed=False, completed_at=None)
    return {"task_id": task_id, "completed": False}


@APP.api
def update_task(
    w: Any,
    access_token: Token,
    task_id: ItemId,
    title: Annotated[str | None, P("new title")] = None,
    due_date: Date = None,
    priority: Annotated[str | None, P("new priority", choices=("low", "medium", "high"))] = None,
) -> dict:
    """Change a task's title, due date and/or priority. Returns: {"task_id"}."""
    it = _item(w, w.user(A, access_token), task_id)
    _check_date(due_date, "due_date")
    for key, value in (("title", title), ("due_date", due_date), ("priority", priority)):
        if value is not None:
            it[key] = value
    return {"task_id": task_id}


@APP.api
def delete_task(w: Any, access_token: Token, task_id: ItemId) -> dict:
    """Delete a task. Returns: {"message"}."""
    _item(w, w.user(A, access_token), task_id)
    del w.table(A, "items")[task_id]
    return {"message": f"task {task_id} deleted"}

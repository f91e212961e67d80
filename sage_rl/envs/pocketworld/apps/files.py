"""files: a small file system - directories are implied by file paths."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, PageIndex, PageLimit, Token, add_auth_apis, page

APP = App("files", "File system: browse directories, read, create, update, move, copy, delete files.")
add_auth_apis(APP)
A = "files"

Path = Annotated[str, P("absolute path, e.g. '/documents/plan.txt'", min_len=2)]


def _norm(path: str, param: str) -> str:
    if not path.startswith("/") or "//" in path or path.endswith("/") and path != "/":
        raise ApiError(
            422, f"files: parameter {param!r} must be an absolute path like '/dir/name.txt', got {path!r}"
        )
    return path


def _by_path(w: Any, path: str, param: str = "path") -> tuple[int, dict]:
    _norm(path, param)
    for k, f in w.table(A, "files").items():
        if f["path"] == path:
            return k, f
    raise ApiError(404, f"files: no file at {param}={path!r}")


def _free(w: Any, path: str, param: str) -> None:
    _norm(path, param)
    if any(f["path"] == path for f in w.table(A, "files").values()):
        raise ApiError(409, f"files: a file already exists at {param}={path!r}")


def _new(w: Any, path: str, content: str, created_at: str) -> int:
    fid = w.new_id(A, "files")
    w.table(A, "files")[fid] = {
        "file_id": fid, "path": path, "content": content, "size": len(content), "created_at": created_at,
        "updated_at": w.now_iso(),
    }  # fmt: skip
    return fid


def _meta(f: dict) -> dict:
    return {k: f[k] for k in ("file_id", "path", "size", "created_at", "updated_at")}


@APP.api
def show_directory(
    w: Any, access_token: Token, path: Annotated[str, P("directory path, e.g. '/' or '/documents'")] = "/",
    page_index: PageIndex = 0, page_limit: PageLimit = 5,
) -> list:  # fmt: skip
    """List the direct children of a directory, sorted by name (subdirectories have type 'directory').

    Returns: a list of {"name", "path", "type"}.
    """
    w.user(A, access_token)
    _norm(path, "path")
    prefix = path.rstrip("/") + "/"
    children: dict[str, str] = {}
    for f in w.table(A, "files").values():
        if f["path"].startswith(prefix):
            head, sep, _ = f["path"][len(prefix) :].partition("/")
            children[head] = "directory" if sep else "file"
    if not children and path != "/":
        raise ApiError(404, f"files: no directory at path={path!r}")
    rows = [{"name": n, "path": prefix + n, "type": t} for n, t in sorted(children.items())]
    return page(rows, page_index, page_limit)


@APP.api
def search_files(
    w: Any,
    access_token: Token,
    directory: Annotated[str, P("search under this directory, recursively")] = "/",
    extension: Annotated[str | None, P("only files with this extension, e.g. 'pdf'")] = None,
    query: Annotated[str, P("words to match in the path (empty: all)")] = "",
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """Find files recursively, sorted by path. Returns: a list of {"file_id", "path", "size", "created_at", "updated_at"}."""
    w.user(A, access_token)
    _norm(directory, "directory")
    prefix = directory.rstrip("/") + "/"
    ext = None if extension is None else "." + extension.lower().lstrip(".")
    rows = [
        _meta(f)
        for f in sorted(w.table(A, "files").values(), key=lambda f: f["path"])
        if f["path"].startswith(prefix) and (ext is None or f["path"].lower().endswith(ext))
        and query.lower() in f["path"].lower()
    ]  # fmt: skip
    return page(rows, page_index, page_limit)


@APP.api
def show_file(w: Any, access_token: Token, path: Path) -> dict:
    """Show a file with its content. Returns: {"file_id", "path", "content", "size", "created_at", "updated_at"}."""
    w.user(A, access_token)
    return _by_path(w, path)[1]


@APP.api
def create_file(
    w: Any, access_token: Token, path: Path, content: Annotated[str, P("text content")] = ""
) -> dict:
    """Create a file (409 if one exists at that path). Returns: {"file_id", "path"}."""
    w.user(A, access_token)
    _free(w, path, "path")
    return {"file_id": _new(w, path, content, w.now_iso()), "path": path}


@APP.api
def update_file(
    w: Any, access_token: Token, path: Path, content: Annotated[str, P("new text")],
    append: Annotated[bool, P("append instead of replacing the content")] = False,
) -> dict:  # fmt: skip
    """Replace (or append to) a file's content. Returns: {"file_id", "size"}."""
    w.user(A, access_token)
    _, f = _by_path(w, path)
    f["content"] = f["content"] + content if append else content
    f.update(size=len(f["content"]), updated_at=w.now_iso())
    return {"file_id": f["file_id"], "size": f["size"]}


@APP.api
def move_file(w: Any, access_token: Token, path: Path, new_path: Path) -> dict:
    """Move or rename a file (409 if new_path is taken). Returns: {"file_id", "path"}."""
    w.user(A, access_token)
    _, f = _by_path(w, path)
    _free(w, new_path, "new_path")
    f["path"] = new_path
    return {"file_id": f["file_id"], "path": new_path}


@APP.api
def copy_file(w: Any, access_token: Token, path: Path, new_path: Path) -> dict:
    """Copy a file to a new path (409 if taken). Returns: {"file_id", "path"}."""
    w.user(A, access_token)
    _, f = _by_path(w, path)
    _free(w, new_path, "new_path")
    return {"file_id": _new(w, new_path, f["content"], w.now_iso()), "path": new_path}


@APP.api
def delete_file(w: Any, access_token: Token, path: Path) -> dict:
    """Delete a file. Returns: {"message"}."""
    w.user(A, access_token)
    key, _ = _by_path(w, path)
    del w.table(A, "files")[key]
    return {"message": f"deleted {path}"}

"""music: a Spotify-like app - songs, artists, likes, ratings, playlists, play history."""

from __future__ import annotations

from typing import Annotated, Any

from sage_rl.envs.pocketworld.api import ApiError, App, P, PageIndex, PageLimit, Token, add_auth_apis, page

APP = App("music", "Music streaming: songs, artists, likes, 1-5 star ratings, playlists, play history.")
add_auth_apis(APP)
A = "music"

SongId = Annotated[int, P("ID of the song", ge=1)]
PlaylistId = Annotated[int, P("ID of the playlist", ge=1)]
ArtistId = Annotated[int, P("ID of the artist", ge=1)]


def _song(w: Any, song_id: int) -> dict:
    return w.get(A, "songs", song_id, "song")


def _my_playlist(w: Any, me: str, playlist_id: int) -> dict:
    pl = w.get(A, "playlists", playlist_id, "playlist")
    if pl["owner"] != me:
        raise ApiError(403, f"music: playlist_id {playlist_id} belongs to someone else")
    return pl


def _summary(s: dict) -> dict:
    keys = ("song_id", "title", "artist_id", "artist_name", "genre", "duration_s")
    return {k: s[k] for k in keys}


def _rows(w: Any, table: str, me: str) -> list[dict]:
    return [r for r in w.table(A, table).values() if r["user"] == me]


@APP.api
def search_songs(
    w: Any,
    query: Annotated[str, P("words to match in the title, album or artist name (empty: all)")] = "",
    genre: Annotated[str | None, P("only songs of this genre")] = None,
    artist_id: Annotated[int | None, P("only songs by this artist")] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """Search the song catalogue, ordered by song_id.

    Returns: a list of {"song_id", "title", "artist_id", "artist_name", "genre", "duration_s"}.
    """
    q = query.lower().strip()
    hits = [
        _summary(s)
        for s in w.table(A, "songs").values()
        if (not q or q in f"{s['title']} {s['album']} {s['artist_name']}".lower())
        and (genre is None or s["genre"] == genre.lower())
        and (artist_id is None or s["artist_id"] == artist_id)
    ]
    return page(hits, page_index, page_limit)


@APP.api
def show_song(w: Any, access_token: Token, song_id: SongId) -> dict:
    """Show one song, with whether you liked it and your rating (null if unrated).

    Returns: {"song_id", "title", "artist_id", "artist_name", "album", "genre", "duration_s",
    "release_year", "play_count", "liked", "my_rating"}.
    """
    me = w.user(A, access_token)
    s = dict(_song(w, song_id))
    s["liked"] = any(r["song_id"] == song_id for r in _rows(w, "likes", me))
    s["my_rating"] = next((r["rating"] for r in _rows(w, "ratings", me) if r["song_id"] == song_id), None)
    return s


@APP.api
def rate_song(
    w: Any, access_token: Token, song_id: SongId, rating: Annotated[int, P("stars", ge=1, le=5)]
) -> dict:
    """Rate a song 1-5 stars (replaces your earlier rating). Returns: {"song_id", "rating"}."""
    me = w.user(A, access_token)
    _song(w, song_id)
    old = next((r for r in _rows(w, "ratings", me) if r["song_id"] == song_id), None)
    if old is not None:
        old.update(rating=rating, rated_at=w.now_iso())
    else:
        rid = w.new_id(A, "ratings")
        w.table(A, "ratings")[rid] = {
            "user": me,
            "song_id": song_id,
            "rating": rating,
            "rated_at": w.now_iso(),
        }
    return {"song_id": song_id, "rating": rating}


@APP.api
def show_my_ratings(
    w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list:
    """List your song ratings. Returns: a list of {"song_id", "rating", "rated_at"}."""
    me = w.user(A, access_token)
    rows = [
        {"song_id": r["song_id"], "rating": r["rating"], "rated_at": r["rated_at"]}
        for r in _rows(w, "ratings", me)
    ]
    return page(rows, page_index, page_limit)


@APP.api
def like_song(w: Any, access_token: Token, song_id: SongId) -> dict:
    """Like a song (409 if already liked). Returns: {"song_id", "liked": true}."""
    me = w.user(A, access_token)
    _song(w, song_id)
    if any(r["song_id"] == song_id for r in _rows(w, "likes", me)):
        raise ApiError(409, f"music: song_id {song_id} is already liked")
    w.table(A, "likes")[w.new_id(A, "likes")] = {"user": me, "song_id": song_id, "liked_at": w.now_iso()}
    return {"song_id": song_id, "liked": True}


@APP.api
def unlike_song(w: Any, access_token: Token, song_id: SongId) -> dict:
    """Remove a song from your liked songs (404 if not liked). Returns: {"song_id", "liked": false}."""
    me = w.user(A, access_token)
    likes = w.table(A, "likes")
    key = next((k for k, r in likes.items() if r["user"] == me and r["song_id"] == song_id), None)
    if key is None:
        raise ApiError(404, f"music: song_id {song_id} is not in your liked songs")
    del likes[key]
    return {"song_id": song_id, "liked": False}


@APP.api
def show_liked_songs(
    w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list:
    """List the songs you liked, oldest like first.

    Returns: a list of {"song_id", "title", "artist_id", "artist_name", "genre", "duration_s", "liked_at"}.
    """
    me = w.user(A, access_token)
    rows = [{**_summary(_song(w, r["song_id"])), "liked_at": r["liked_at"]} for r in _rows(w, "likes", me)]
    return page(rows, page_index, page_limit)


@APP.api
def show_playlists(w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5) -> list:
    """List your playlists. Returns: a list of {"playlist_id", "title", "is_public", "num_songs"}."""
    me = w.user(A, access_token)
    rows = [
        {"playlist_id": k, "title": p["title"], "is_public": p["is_public"], "num_songs": len(p["song_ids"])}
        for k, p in w.table(A, "playlists").items()
        if p["owner"] == me
    ]
    return page(rows, page_index, page_limit)


@APP.api
def show_playlist(w: Any, access_token: Token, playlist_id: PlaylistId) -> dict:
    """Show one of your playlists with its songs in order.

    Returns: {"playlist_id", "title", "is_public", "created_at", "songs": [{"song_id", "title",
    "artist_id", "artist_name", "genre", "duration_s"}]}.
    """
    me = w.user(A, access_token)
    p = _my_playlist(w, me, playlist_id)
    songs = [_summary(_song(w, s)) for s in p["song_ids"]]
    return {
        "playlist_id": playlist_id,
        **{k: p[k] for k in ("title", "is_public", "created_at")},
        "songs": songs,
    }


@APP.api
def create_playlist(
    w: Any,
    access_token: Token,
    title: Annotated[str, P("title of the new playlist", min_len=1, max_len=80)],
    is_public: Annotated[bool, P("whether others can see it")] = False,
) -> dict:
    """Create an empty playlist (409 if you already have one with that title). Returns: {"playlist_id"}."""
    me = w.user(A, access_token)
    if any(p["owner"] == me and p["title"] == title for p in w.table(A, "playlists").values()):
        raise ApiError(409, f"music: you already have a playlist with title {title!r}")
    pid = w.new_id(A, "playlists")
    w.table(A, "playlists")[pid] = {
        "owner": me,
        "title": title,
        "song_ids": [],
        "is_public": is_public,
        "created_at": w.now_iso(),
    }
    return {"playlist_id": pid}


@APP.api
def update_playlist_title(
    w: Any,
    access_token: Token,
    playlist_id: PlaylistId,
    title: Annotated[str, P("new title", min_len=1, max_len=80)],
) -> dict:
    """Rename one of your playlists. Returns: {"playlist_id", "title"}."""
    me = w.user(A, access_token)
    _my_playlist(w, me, playlist_id)["title"] = title
    return {"playlist_id": playlist_id, "title": title}


@APP.api
def delete_playlist(w: Any, access_token: Token, playlist_id: PlaylistId) -> dict:
    """Delete one of your playlists. Returns: {"message"}."""
    me = w.user(A, access_token)
    _my_playlist(w, me, playlist_id)
    del w.table(A, "playlists")[playlist_id]
    return {"message": f"playlist {playlist_id} deleted"}


@APP.api
def add_song_to_playlist(w: Any, access_token: Token, playlist_id: PlaylistId, song_id: SongId) -> dict:
    """Append a song to one of your playlists (409 if it is already there). Returns: {"playlist_id", "num_songs"}."""
    me = w.user(A, access_token)
    p = _my_playlist(w, me, playlist_id)
    _song(w, song_id)
    if song_id in p["song_ids"]:
        raise ApiError(409, f"music: song_id {song_id} is already in playlist_id {playlist_id}")
    p["song_ids"].append(song_id)
    return {"playlist_id": playlist_id, "num_songs": len(p["song_ids"])}


@APP.api
def remove_song_from_playlist(w: Any, access_token: Token, playlist_id: PlaylistId, song_id: SongId) -> dict:
    """Remove a song from one of your playlists. Returns: {"playlist_id", "num_songs"}."""
    me = w.user(A, access_token)
    p = _my_playlist(w, me, playlist_id)
    if song_id not in p["song_ids"]:
        raise ApiError(404, f"music: song_id {song_id} is not in playlist_id {playlist_id}")
    p["song_ids"].remove(song_id)
    return {"playlist_id": playlist_id, "num_songs": len(p["song_ids"])}


@APP.api
def search_artists(
    w: Any,
    query: Annotated[str, P("words to match in the artist name (empty: all)")] = "",
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list:
    """Search artists. Returns: a list of {"artist_id", "name", "genre", "follower_count"}."""
    q = query.lower().strip()
    rows = [a for a in w.table(A, "artists").values() if q in a["name"].lower()]
    return page(rows, page_index, page_limit)


@APP.api
def follow_artist(w: Any, access_token: Token, artist_id: ArtistId) -> dict:
    """Follow an artist (409 if you already do). Returns: {"artist_id", "following": true}."""
    me = w.user(A, access_token)
    artist = w.get(A, "artists", artist_id, "artist")
    if any(r["artist_id"] == artist_id for r in _rows(w, "follows", me)):
        raise ApiError(409, f"music: you already follow artist_id {artist_id}")
    w.table(A, "follows")[w.new_id(A, "follows")] = {
        "user": me,
        "artist_id": artist_id,
        "followed_at": w.now_iso(),
    }
    artist["follower_count"] += 1
    return {"artist_id": artist_id, "following": True}


@APP.api
def unfollow_artist(w: Any, access_token: Token, artist_id: ArtistId) -> dict:
    """Stop following an artist. Returns: {"artist_id", "following": false}."""
    me = w.user(A, access_token)
    follows = w.table(A, "follows")
    key = next((k for k, r in follows.items() if r["user"] == me and r["artist_id"] == artist_id), None)
    if key is None:
        raise ApiError(404, f"music: you do not follow artist_id {artist_id}")
    del follows[key]
    w.table(A, "artists")[artist_id]["follower_count"] -= 1
    return {"artist_id": artist_id, "following": False}


@APP.api
def show_following_artists(
    w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list:
    """List the artists you follow. Returns: a list of {"artist_id", "name", "genre"}."""
    me = w.user(A, access_token)
    arts = w.table(A, "artists")
    rows = [
        {
            "artist_id": r["artist_id"],
            "name": arts[r["artist_id"]]["name"],
            "genre": arts[r["artist_id"]]["genre"],
        }
        for r in _rows(w, "follows", me)
    ]
    return page(rows, page_index, page_limit)


@APP.api
def show_play_history(
    w: Any, access_token: Token, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list:
    """List the songs you played, most recent first.

    Returns: a list of {"song_id", "title", "artist_name", "played_at"}.
    """
    me = w.user(A, access_token)
    plays = sorted(_rows(w, "history", me), key=lambda r: r["played_at"], reverse=True)
    songs = w.table(A, "songs")
    rows = [
        {
            "song_id": r["song_id"],
            "title": songs[r["song_id"]]["title"],
            "artist_name": songs[r["song_id"]]["artist_name"],
            "played_at": r["played_at"],
        }
        for r in plays
    ]
    return page(rows, page_index, page_limit)

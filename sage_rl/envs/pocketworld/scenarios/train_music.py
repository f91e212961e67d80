"""Train templates over the music app."""

from __future__ import annotations

from collections import Counter

from sage_rl.envs.pocketworld.checks import Allow, Expect, Require
from sage_rl.envs.pocketworld.scenarios import helpers as h
from sage_rl.envs.pocketworld.scenarios.base import Template

# ---------------------------------------------------------------------------- rate unrated playlist songs


def _rate_sample(rng, w):
    db = w.db
    rated = h.my_ratings(db)
    titles = [p["title"] for p in h.playlists(db).values() if any(s not in rated for s in p["song_ids"])]
    return {"playlist": h.pick(rng, titles, "playlist with unrated songs"), "rating": rng.randrange(1, 6)}


def _rate_expect(db, p):
    rated = h.my_ratings(db)
    todo = {s for s in h.playlists(db)[h.playlist_id(db, p["playlist"])]["song_ids"] if s not in rated}
    return Expect(
        requires=(
            Require(
                "unrated playlist songs got the rating",
                lambda f: all(h.my_ratings(f).get(s) == p["rating"] for s in todo),
            ),
        ),
        allow=(Allow("music", "ratings", lambda r: r["user"] == h.me(db) and r["song_id"] in todo),),
    )


RATE_PLAYLIST = Template(
    name="music_rate_unrated_playlist_songs",
    split="train",
    apps=("music",),
    difficulty=2,
    phrasings=(
        "Give a {rating}-star rating to every song in my '{playlist}' playlist that I have not rated yet.",
        "Rate all the songs in my '{playlist}' playlist that don't have a rating from me yet with {rating} stars.",
        "In my '{playlist}' playlist, find the songs I haven't rated and give each of them {rating} stars.",
    ),
    sample=_rate_sample,
    expect=_rate_expect,
    skill_source='''
def rate_unrated_playlist_songs(playlist_title: str, rating: int) -> int:
    """Give `rating` stars to every song of my playlist `playlist_title` that I have not rated; return how many."""
    token = login_to("music")
    playlists = fetch_all(apis.music.show_playlists, access_token=token)
    playlist = next(p for p in playlists if p["title"] == playlist_title)
    songs = apis.music.show_playlist(access_token=token, playlist_id=playlist["playlist_id"])["songs"]
    count = 0
    for song in songs:
        if apis.music.show_song(access_token=token, song_id=song["song_id"])["my_rating"] is None:
            apis.music.rate_song(access_token=token, song_id=song["song_id"], rating=rating)
            count += 1
    return count
''',
    skill_names=("rate_unrated_playlist_songs",),
    call="rate_unrated_playlist_songs({playlist!r}, {rating})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- count liked songs of a genre


def _genre_sample(rng, w):
    counts = Counter(w.db["music"]["songs"][s]["genre"] for s in h.liked(w.db))
    return {"genre": h.spread(rng, h.COUNTS, counts)}


def _genre_expect(db, p):
    n = sum(db["music"]["songs"][s]["genre"] == p["genre"] for s in h.liked(db))
    return Expect(answer=n)


COUNT_LIKED_GENRE = Template(
    name="music_count_liked_genre",
    split="train",
    apps=("music",),
    difficulty=1,
    phrasings=(
        "How many of the songs I have liked are {genre} songs?",
        "Count my liked songs in the {genre} genre.",
        "What number of {genre} tracks are among my liked songs?",
    ),
    sample=_genre_sample,
    expect=_genre_expect,
    skill_source='''
def count_liked_songs_by_genre(genre: str) -> int:
    """Return how many of my liked songs have genre `genre`."""
    token = login_to("music")
    return sum(song["genre"] == genre for song in fetch_all(apis.music.show_liked_songs, access_token=token))
''',
    skill_names=("count_liked_songs_by_genre",),
    call="apis.supervisor.complete_task(answer=count_liked_songs_by_genre({genre!r}))",
)

# ---------------------------------------------------------------------------- playlist duration


def _duration_sample(rng, w):
    return {"playlist": h.pick(rng, sorted(p["title"] for p in h.playlists(w.db).values()), "playlist")}


def _duration_expect(db, p):
    songs = db["music"]["songs"]
    total = sum(songs[s]["duration_s"] for s in h.playlists(db)[h.playlist_id(db, p["playlist"])]["song_ids"])
    return Expect(answer=round(total / 60))


PLAYLIST_DURATION = Template(
    name="music_playlist_duration",
    split="train",
    apps=("music",),
    difficulty=1,
    phrasings=(
        "How long is my '{playlist}' playlist in total? Answer in minutes, rounded to the nearest whole minute.",
        "What is the total running time of my '{playlist}' playlist, in whole minutes (rounded)?",
        "Tell me how many minutes my '{playlist}' playlist lasts, rounded to the nearest minute.",
    ),
    sample=_duration_sample,
    expect=_duration_expect,
    skill_source='''
def playlist_duration_minutes(playlist_title: str) -> int:
    """Return the total duration of my playlist `playlist_title` in minutes, rounded to the nearest minute."""
    token = login_to("music")
    playlist = next(p for p in fetch_all(apis.music.show_playlists, access_token=token) if p["title"] == playlist_title)
    songs = apis.music.show_playlist(access_token=token, playlist_id=playlist["playlist_id"])["songs"]
    return round(sum(song["duration_s"] for song in songs) / 60)
''',
    skill_names=("playlist_duration_minutes",),
    call="apis.supervisor.complete_task(answer=playlist_duration_minutes({playlist!r}))",
)

# ---------------------------------------------------------------------------- like all songs of an artist


def _artist_songs(db, name):
    return {k for k, s in db["music"]["songs"].items() if s["artist_name"] == name}


def _like_sample(rng, w):
    names = sorted({s["artist_name"] for s in w.db["music"]["songs"].values()})
    ok = [n for n in names if _artist_songs(w.db, n) - h.liked(w.db)]
    return {"artist": h.pick(rng, ok, "artist with unliked songs")}


def _like_expect(db, p):
    songs = _artist_songs(db, p["artist"])
    return Expect(
        requires=(Require("every song by the artist is liked", lambda f: songs <= h.liked(f)),),
        allow=(Allow("music", "likes", lambda r: r["user"] == h.me(db) and r["song_id"] in songs),),
    )


LIKE_ARTIST = Template(
    name="music_like_artist_songs",
    split="train",
    apps=("music",),
    difficulty=2,
    phrasings=(
        "Like every song by {artist} that I haven't liked yet.",
        "I love {artist}: make sure all of their songs are in my liked songs.",
        "Add all songs by {artist} to my liked songs, skipping the ones already there.",
    ),
    sample=_like_sample,
    expect=_like_expect,
    skill_source='''
def like_all_songs_by_artist(artist_name: str) -> int:
    """Like every song by the artist named `artist_name` that I have not liked yet; return how many."""
    token = login_to("music")
    artist = next(a for a in fetch_all(apis.music.search_artists, query=artist_name) if a["name"] == artist_name)
    count = 0
    for song in fetch_all(apis.music.search_songs, artist_id=artist["artist_id"]):
        if not apis.music.show_song(access_token=token, song_id=song["song_id"])["liked"]:
            apis.music.like_song(access_token=token, song_id=song["song_id"])
            count += 1
    return count
''',
    skill_names=("like_all_songs_by_artist",),
    call="like_all_songs_by_artist({artist!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- playlist from liked genre


def _gp_sample(rng, w):
    counts = Counter(w.db["music"]["songs"][s]["genre"] for s in h.liked(w.db))
    genre = h.pick(rng, sorted(g for g, n in counts.items() if n >= 2), "genre with 2+ liked songs")
    return {"genre": genre, "title": f"Best of {genre.title()}"}


def _gp_expect(db, p):
    want = {s for s in h.liked(db) if db["music"]["songs"][s]["genre"] == p["genre"]}

    def made(f):
        mine = [x for x in h.playlists(f).values() if x["title"] == p["title"]]
        return len(mine) == 1 and set(mine[0]["song_ids"]) == want and len(mine[0]["song_ids"]) == len(want)

    return Expect(
        requires=(Require("the playlist holds exactly the liked songs of the genre", made),),
        allow=(Allow("music", "playlists", lambda r: r["owner"] == h.me(db) and r["title"] == p["title"]),),
    )


GENRE_PLAYLIST = Template(
    name="music_playlist_from_liked_genre",
    split="train",
    apps=("music",),
    difficulty=3,
    phrasings=(
        "Create a playlist called '{title}' containing all the {genre} songs I have liked.",
        "Make me a new playlist named '{title}' with every {genre} song from my liked songs.",
        "Put all my liked {genre} songs into a new playlist titled '{title}'.",
    ),
    sample=_gp_sample,
    expect=_gp_expect,
    skill_source='''
def playlist_from_liked_genre(title: str, genre: str) -> int:
    """Create playlist `title` holding every liked song of genre `genre`; return its playlist_id."""
    token = login_to("music")
    liked = [s for s in fetch_all(apis.music.show_liked_songs, access_token=token) if s["genre"] == genre]
    playlist_id = apis.music.create_playlist(access_token=token, title=title)["playlist_id"]
    for song in liked:
        apis.music.add_song_to_playlist(access_token=token, playlist_id=playlist_id, song_id=song["song_id"])
    return playlist_id
''',
    skill_names=("playlist_from_liked_genre",),
    call="playlist_from_liked_genre({title!r}, {genre!r})\napis.supervisor.complete_task()",
)

# ---------------------------------------------------------------------------- most played artist


def _mp_sample(rng, w):
    songs = w.db["music"]["songs"]
    h.unique_max(Counter(songs[r["song_id"]]["artist_name"] for r in w.db["music"]["history"].values()))
    return {}


def _mp_expect(db, p):
    songs = db["music"]["songs"]
    return Expect(
        answer=h.unique_max(
            Counter(songs[r["song_id"]]["artist_name"] for r in db["music"]["history"].values())
        )
    )


MOST_PLAYED_ARTIST = Template(
    name="music_most_played_artist",
    split="train",
    apps=("music",),
    difficulty=2,
    phrasings=(
        "Which artist have I listened to the most in my play history? Just give the name.",
        "Looking at my music play history, who is the artist I played most often?",
        "Find the artist that appears most often in my play history and tell me their name.",
    ),
    sample=_mp_sample,
    expect=_mp_expect,
    skill_source='''
def most_played_artist() -> str:
    """Return the name of the artist that appears most often in my music play history."""
    token = login_to("music")
    counts = {}
    for play in fetch_all(apis.music.show_play_history, access_token=token):
        counts[play["artist_name"]] = counts.get(play["artist_name"], 0) + 1
    return max(counts, key=counts.get)
''',
    skill_names=("most_played_artist",),
    call="apis.supervisor.complete_task(answer=most_played_artist())",
)

TEMPLATES = (
    RATE_PLAYLIST,
    COUNT_LIKED_GENRE,
    PLAYLIST_DURATION,
    LIKE_ARTIST,
    GENRE_PLAYLIST,
    MOST_PLAYED_ARTIST,
)

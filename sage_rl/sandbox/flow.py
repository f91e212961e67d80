"""Value flow: whether a library skill's work reached the world (the skill credit ``flow``).

``skills.credit: api`` pays a call of a skill that returned and made a successful API call, whatever
the task then did with it: a read-only skill called and ignored while the task is solved inline was
paid like a real use. Under ``flow`` a skill's calls must also have an **effect**, counted here:

- a successful API call that **changed the world** (the environment compares its state before and
  after the call: ``Session``'s ``fingerprint``) was made by the skill's own code while it ran: the
  effect belongs to every library skill open at that moment, when one of them names the API
  (``tracking.record_api_call``: skills handed an API, by value or by name, make its calls for the
  task, and what they return is then among their calls' inputs);
- a value the skill **returned** reached a **sink**: the arguments of an API call that changed the
  world, or the answer passed to ``supervisor.complete_task``. Values are matched as *atoms*: the
  strings of 3 characters or more, the integers of 1000 or more (ids, counts and ratings below that
  are everywhere in a listing, so they identify nothing) and the other finite numbers (amounts)
  inside the returned value, walked through plain dicts, lists, tuples and sets only, so no
  agent-defined method ever runs. A returned scalar counts whole, whatever its size (a count of 1
  submitted as the answer, an id), and so does the length of a returned container (the task's
  ``len(notes_with_tag('health'))``, the commonest value derived from a skill's). A returned atom
  that was among the call's own arguments is not the skill's (``find(name)`` returning ``name``):
  the arguments count whole (each one itself, whatever its size, its length when a container, and
  every scalar inside, small ones too), and a call given what flow cannot read through (a function
  or lambda, an object of the task's class, a generator, a container past ``MAX_ATOMS`` items:
  ``OPAQUE``) provides nothing by its return (``run(lambda: n)`` returns what the task's code made;
  its writes still count); atoms are compared as the PocketWorld checker compares answers
  (``checks.normalize``: strings lower-cased, whitespace collapsed, " ." stripped, numeric text as
  its number; numbers rounded to cents, within one cent; a comma-separated text as its parts), so
  ``echo(20)``, ``x.upper()`` or ``x + 0.001`` returned by a skill given ``x`` is not the skill's
  to provide; a string atom of 4 characters or more also matches as whole words inside a longer
  argument (a message body), not inside a credential (an ``access_token`` named after its app);
- what the task gave a skill, and what the task's own writes put in the world (the scalars of
  their arguments that no skill provided), is the task's in every later call too: a skill that
  keeps what it was handed, or reads back a note the task wrote, provides none of it; past
  ``MAX_PROVIDED`` such values nothing is provided any more (fail closed);
- the last source of an atom owns it: a read (an API call that changed nothing) made by the task's
  own code takes the atoms of its result (with its length, as for a skill's) for the providers of
  its arguments' atoms (a token, an id a skill returned), and for nobody when it used none. So a
  skill called and ignored while the task reads the same data itself is not paid when the task
  uses that data;
- a skill T **serves** a skill S when T returned while S's call was open (a helper S called), when
  S was called with T's atoms among its arguments (``text_people(recent_senders(3), msg)``), or
  when a read made by S's code used T's atoms; an effect of S is then T's too.

An environment that cannot compare states (``changed`` None) makes every successful API call that
does work a sink and an effect of the open skills: ``flow`` then pays like ``api``. The providers live
as long as the interpreter.

Each effect is an **event**: the answer (0), or the world change it rests on, by its order in the
episode (1, 2, ...; 0 where the environment cannot tell). The events are kept per cell per skill
(``CallRecord.effects``, ``CallRecord.changes``), and ``skills/usage.py`` pays only those that count:

- the answer is the one the checks score: the last ``complete_task`` that succeeded (AppWorld's and
  PocketWorld's accept any number of calls, and the last answer stays), so a later submission takes
  the answer event from the skills an earlier one credited (``complete_task(answer=get_email())``
  then ``complete_task(answer=20)`` pays nothing). Every submission of an episode is in one cell
  (the episode ends with the cell that completed it: ``rollout/episode.py``), so this is per cell;
- the answer counts only where the checks scored one: an environment says so at the end
  (``Outcome.answer_scored``; PocketWorld: the task asks for an answer), so a skill's value passed
  as the answer of a task that asks for none pays nothing (``CallRecord.reached``; an environment
  that says so numbers its changes, so its event 0 is the answer alone);
- a change must **last**: the environment says at the end which changes' work is still there
  (``Outcome.lasting``; PocketWorld: a field holds what the change put there, not what it held at
  the start), so a skill whose write the task (or the skill) undid or overwrote, or that created
  what was then deleted, is not paid.

Limits, stated once: values match by value, so a value the task prints and the model types again
counts (as it should), and so does any literal that happens to equal what a skill returned (a
small count equal to the answer); a skill called after the task read the same data itself takes
it back; a value used only to decide (an ``if``, a filter whose result the task computes further)
reaches nothing by value. The exclusion of a call's arguments matches values, not computations: a
skill that returns something the checker takes for an argument (``echo(x)``, ``x.upper()``) gives
nothing, but one that computes its result from its arguments (``x + 1``, ``sum(xs)``) passes the
task's own value off as its own. What a skill reads from the task's namespace is kept out by
extraction (a skill that reads a task's variable is not saved: ``skills/extract._self_contained``)
and by the sandbox (modules, functions and ``apis`` are read-only to agent code: ``stores.py``;
each namespace has its own module copies, so ``random.setstate`` moves the task's generator only).
What both namespaces still share (C modules' state, objects both hold, the worker's caches C code
reaches, strings' identity) and the task's code run inside a skill's call are the sandbox's to
handle: a skill call they touch provides nothing (docs/sandbox.md, "Shared state", with the channels
left open: the clock, the stack's depth, a cache's timing, C callables as finalizers or cache keys).
The in-process executor shares every module.
At most ``MAX_ATOMS`` atoms are read from one value and ``MAX_PROVIDED`` remembered in all (past
them nothing new is provided: less credit, never more).

This module is imported by the template process: of the project it imports only ``answer_keys`` and ``shared``.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from sage_rl.sandbox.answer_keys import Key, among, keys_of
from sage_rl.sandbox.shared import SharedState

#: ``supervisor.complete_task``: its ``answer`` is a sink (sage_rl.sandbox.tracking.IDLE_APIS).
COMPLETE = ("supervisor", "complete_task")
MAX_ATOMS = 4096
MAX_PROVIDED = 50_000
MIN_CHARS = 3
MIN_INT = 1000
SUBSTRING_CHARS = 4
MAX_ATOM_CHARS = 1000
MAX_TEXT_CHARS = 20_000  # longer arguments are not searched for provided strings
CREDENTIALS = ("token", "password")  # arguments so named are not searched for provided strings

Atom = tuple[str, Any]  # ("s", text) | ("n", float) | ("b", bool)
SkillKey = tuple[str, str]  # (qualified name, origin), as in the call records


def _number(v: Any) -> float | None:
    """``v`` as the float it matches by: an int within 2**53, a finite float; else None (an int
    past the float range would raise in ``float``; agent code may return one)."""
    t = type(v)
    if t is int:
        return float(v) if -(2**53) <= v <= 2**53 else None
    if t is float and math.isfinite(v):
        return v
    return None


def _scalar(value: Any) -> Atom | None:
    t = type(value)
    if t is bool:
        return ("b", value)
    if (n := _number(value)) is not None:
        return ("n", n)
    if t is str and len(value) <= MAX_ATOM_CHARS:
        return ("s", value)
    return None


def _walk(value: Any, cut: list[bool] | None = None) -> Iterator[Any]:
    """The leaves of ``value`` through plain dicts, lists, tuples and sets (exact types: no agent
    method runs), at most ``MAX_ATOMS`` items visited, however large a container (``cut`` is told
    when items were left)."""
    todo, seen = [value], 0
    while todo:
        if seen >= MAX_ATOMS:
            if cut is not None:
                cut.append(True)
            return
        v = todo.pop()
        seen += 1
        t = type(v)
        if t is dict or t is list or t is tuple or t is set or t is frozenset:
            room = MAX_ATOMS - seen
            if cut is not None and len(v) > room:
                cut.append(True)
            todo.extend(itertools.islice(dict.values(v) if t is dict else v, room))
        else:
            yield v


def _is_atom(a: Atom) -> bool:
    """Whether a scalar ``a`` (``_scalar``) identifies anything inside a value (module docstring)."""
    kind, v = a
    if kind == "s":
        return len(v) >= MIN_CHARS
    return kind == "n" and (abs(v) >= MIN_INT or not v.is_integer())


def atoms(value: Any, whole: bool = False) -> set[Atom]:
    """The atoms inside ``value`` (module docstring); with ``whole``, a scalar ``value`` itself too,
    whatever its size."""
    out: set[Atom] = set()
    if whole and (key := _scalar(value)) is not None:
        out.add(key)
    out.update(a for v in _walk(value) if (a := _scalar(v)) is not None and _is_atom(a))
    return out


def _itself(value: Any) -> Atom | None:
    """A value counted whole: itself when a scalar (any size), its length when a container."""
    if type(value) in (list, tuple, dict, set, frozenset):
        return ("n", float(len(value)))
    return _scalar(value)


def _result_atoms(value: Any) -> set[Atom]:
    """The atoms of a returned value: its atoms, itself when a scalar, its length when a container."""
    found = atoms(value)
    if (whole := _itself(value)) is not None:
        found.add(whole)
    return found


def _texts(kwargs: Mapping[str, Any]) -> list[str]:
    """The strings inside a call's arguments long enough to hold a provided string, for substring
    matches; not inside a credential (``access_token``, ``password``): a skill that returned an app's
    name (``'music'``) does not serve every call made with a ``music-...`` token."""
    plain = {k: v for k, v in kwargs.items() if not any(c in str(k).lower() for c in CREDENTIALS)}
    return [v for v in _walk(plain) if type(v) is str and SUBSTRING_CHARS < len(v) <= MAX_TEXT_CHARS]


def _holds(text: str, part: str) -> bool:
    """Whether ``part`` occurs in ``text`` as whole words: no letter or digit right before or after
    it (``'Mira'`` in ``'Hi Mira,'``, not in ``'Miranda'``)."""
    i = text.find(part)
    while i >= 0:
        j = i + len(part)
        if (i == 0 or not text[i - 1].isalnum()) and (j == len(text) or not text[j].isalnum()):
            return True
        i = text.find(part, i + 1)
    return False


#: Among a call's inputs: an argument flow cannot see through (a function, the task's object, a
#: generator; a container past ``MAX_ATOMS`` items). Whatever the call returns may be the task's.
OPAQUE: Atom = ("o", None)
_PLAIN = (str, int, float, bool, type(None))


def _input_atoms(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[set[Atom], set[Atom]]:
    """(the atoms inside a call's arguments; those, the arguments counted whole (each argument
    itself, a scalar of any size, and its length when a container) and every scalar inside them,
    small ones too, with ``OPAQUE`` when an argument could not be read through), read when the
    call starts."""
    values = [*itertools.islice(args, MAX_ATOMS), *itertools.islice(kwargs.values(), MAX_ATOMS)]
    inside: set[Atom] = set()
    whole = {a for v in values if (a := _itself(v)) is not None}
    cut: list[bool] = []
    for v in _walk(values, cut):  # one walk: this runs at every call of a library skill
        if type(v) not in _PLAIN:
            whole.add(OPAQUE)
        elif (a := _scalar(v)) is not None:
            whole.add(a)
            if _is_atom(a):
                inside.add(a)
    if cut:
        whole.add(OPAQUE)
    return inside, whole


def input_keys(args: Sequence[Any], kwargs: Mapping[str, Any]) -> set[Key]:
    """The keys of a call's arguments, counted whole: each argument itself (a scalar of any size),
    its length when a container, every scalar inside it, and the parts of a comma-separated text."""
    return keys_of(_input_atoms(args, kwargs)[1] - {OPAQUE})


class FlowTracker:
    """Providers of atoms, what served what, and the effects counted this cell (module docstring)."""

    def __init__(self, shared: SharedState | None = None) -> None:
        self.providers: dict[Atom, set[SkillKey]] = {}
        self.served: dict[SkillKey, set[SkillKey]] = {}  # S -> skills whose values S's reads used
        self._changes: dict[SkillKey, set[int]] = {}  # the world changes (events > 0, or 0) this cell
        self._answer: set[SkillKey] = set()  # the skills the last answer submitted this cell carries
        self.given: set[Atom] = set()  # every input of a skill call so far (``_remember_given``)
        self._given_keys: set[Key] = set()
        self._given_full = False  # past ``MAX_PROVIDED``: no skill provides anything any more
        # decimal's context, csv's registry, attributes on shared objects (shared.py), from now on
        self.shared = shared if shared is not None else SharedState()
        # as the bridge and the call stacks are (tracking.py): threads, should agent code ever get
        # them (rules.py refuses `threading` today); no agent code runs under it
        self._lock = threading.Lock()

    def start_cell(self) -> None:
        self._changes, self._answer = {}, set()

    @property
    def effects(self) -> dict[SkillKey, set[int]]:
        """The events (module docstring) of each skill whose work reached the world this cell."""
        with self._lock:
            out = {s: set(e) for s, e in self._changes.items()}
            for s in self._answer:
                out.setdefault(s, set()).add(0)
        return out

    def inputs(
        self, skill: SkillKey, args: Sequence[Any], kwargs: Mapping[str, Any], by_task: bool = True
    ) -> set[Atom]:
        """A call of ``skill`` starts: the atoms of its arguments, whole (``input_keys``: not the
        skill's to provide), read now (the skill may change a list it was given). The skills that
        provided the atoms inside them serve it. ``by_task``: no library skill made the call (what
        the task gives a skill is the task's in later calls too: ``_remember_given``). A call that
        starts while the shared state has moved (``shared.py``: a stash a skill could read back)
        provides nothing, as a call given a callback."""
        inside, whole = _input_atoms(args, kwargs)
        if self.shared.moved():
            whole.add(OPAQUE)
        with self._lock:
            given = inside & self.providers.keys()
            givers = set().union(*(self.providers[a] for a in given)) - {skill}
            if givers:
                self.served.setdefault(skill, set()).update(givers)
            if by_task:
                self._remember_given(whole)
        return whole

    def _remember_given(self, found: set[Atom]) -> None:
        """What the task gave a skill (or a skill fetched for it: ``handed``) is the task's in every
        later call too: a skill that keeps state (a mutable default, a module's list) gave back in
        a later call what an earlier one was handed (``box(20)`` then ``box()``). Not what skills
        give their helpers: a list id a skill passed ``fetch_all`` equalled a later count."""
        new = found - self.given
        new.discard(OPAQUE)
        if new and len(self.given) < MAX_PROVIDED:
            self.given |= new
            self._given_keys |= keys_of(new)
        elif new:  # what it cannot remember any more, a skill could give back: fail closed
            self._given_full = True

    def returned(self, skill: SkillKey, inputs: set[Atom], value: Any, caller: SkillKey | None) -> None:
        """A call of ``skill`` returned ``value``; ``inputs``: what ``inputs`` gave for the call;
        ``caller``: the innermost library skill still open (the skill it served), if any. The
        inputs become keys only when the value holds atoms (a skill in a loop costs little)."""
        # ``run(lambda: n)`` returns what the task's code made; past the cap, what the task gave is unknown
        if OPAQUE in inputs or self._given_full:
            found: set[Atom] = set()
        else:
            pending = _result_atoms(value) - inputs - self.given  # the inputs' whether keys or not
            keys = keys_of(inputs) if pending and inputs else set()
            found = {a for a in pending if not among(a, keys) and not among(a, self._given_keys)}
        with self._lock:
            self._provide(found, {skill})
            if caller is not None and caller != skill:
                self.served.setdefault(caller, set()).add(skill)

    def api_call(
        self,
        open_skills: Sequence[SkillKey],
        app: str,
        api: str,
        kwargs: Mapping[str, Any],
        value: Any,
        changed: int | None,
        works: bool,
        handed: Sequence[set[Atom]] = (),
    ) -> None:
        """A successful API call made by the code of ``open_skills`` (outermost first; none: the
        task's call); ``changed``: 0 when it changed nothing, n when it was the episode's n-th
        change of the world, None when the environment cannot tell; ``works`` is
        ``tracking.does_work(app, api)``; ``handed``: the ``inputs`` of the open skill calls that
        made it for the task (none of them names the API: ``tracking.record_api_call``), to which
        its result is added, as if they had been given it."""
        if handed:
            got = _result_atoms(value)
            for given in handed:
                given |= got
            with self._lock:
                self._remember_given(got)
        answer = (app, api) == COMPLETE
        args = atoms(dict(kwargs)) | (atoms(kwargs.get("answer"), whole=True) if answer else set())
        wrote = changed > 0 if changed is not None else works
        event = changed or 0  # a change by its number; 0 where the environment cannot number it
        with self._lock:
            sources = self._sources(args, kwargs)
            if answer:  # it replaces the answer an earlier call submitted (module docstring)
                self._answer = self._served_by([*sources, *(open_skills if wrote else ())])
            elif wrote:
                for s in self._served_by([*open_skills, *sources]):
                    self._changes.setdefault(s, set()).add(event)
                if not open_skills:  # the task's own write: what it put in the world, no skill gave
                    self._remember_given(_input_atoms((), kwargs)[1] - self.providers.keys())
            elif open_skills:
                self.served.setdefault(open_skills[-1], set()).update(sources)
            else:
                self._provide(_result_atoms(value) - args, sources, replace=True)

    def _sources(self, args: set[Atom], kwargs: Mapping[str, Any]) -> set[SkillKey]:
        out: set[SkillKey] = set()
        for a in args:
            out |= self.providers.get(a, set())
        texts = _texts(kwargs)
        if texts:
            for (kind, v), who in self.providers.items():
                if (
                    kind == "s"
                    and len(v) >= SUBSTRING_CHARS
                    and not who <= out
                    and any(_holds(t, v) for t in texts)
                ):
                    out |= who
        return out

    def _provide(self, found: Iterable[Atom], by: set[SkillKey], replace: bool = False) -> None:
        """``by`` provides ``found``: besides the providers known (a skill's return), or instead
        of them (``replace``: the task's own read)."""
        for a in found:
            known = self.providers.get(a)
            if replace and not by:
                self.providers.pop(a, None)
            elif known is not None and not replace:
                known |= by
            elif known is not None or len(self.providers) < MAX_PROVIDED:
                self.providers[a] = set(by)

    def _served_by(self, skills: Iterable[SkillKey]) -> set[SkillKey]:
        """``skills`` and every skill that served one of them, transitively: an effect's owners."""
        todo, done = list(skills), set()
        while todo:
            s = todo.pop()
            if s not in done:
                done.add(s)
                todo.extend(self.served.get(s, ()))
        return done

"""Render one or two runs into one self-contained HTML file (Jinja2 templates, Pygments highlighting).

The page holds everything: styles, script, and charts as data URIs; it needs no network and no
server. Large runs stay usable through pages: the Chains and Skills tabs are cut into pages of at
most ``page_size`` trajectories (a group is never split, so a larger group is a page). The first page is ordinary HTML; the
others are ``<template>`` elements, which the browser parses but neither lays out nor runs until
the script shows one (when its button or a link into it is clicked).
"""

from __future__ import annotations

import dataclasses
import functools
import html
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import jinja2
from markupsafe import Markup
from pygments import highlight
from pygments.filter import simplefilter
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer, YamlLexer
from pygments.styles import get_style_by_name
from pygments.token import Token

from sage_rl.text import valid_text
from sage_rl.view.chains import ChainOptions, section_view
from sage_rl.view.collected import collect_sections
from sage_rl.view.compare import CompareView, compare, compared_sections
from sage_rl.view.model import GroupView, SectionView, SkillView, TrajView, TurnView
from sage_rl.view.overview import OverviewView, overview, step_stats
from sage_rl.view.read import RunData, read_run

STYLE = "friendly"
_FORMATTER = HtmlFormatter(nowrap=True)


@functools.cache
def _plain(ttype) -> bool:
    style, known = get_style_by_name(STYLE), ttype
    while not style.styles_token(known) and known.parent is not None:
        known = known.parent  # as the formatter does: a token takes its nearest styled ancestor's style
    s = style.style_for_token(known)
    return ttype in Token.Text.Whitespace or not any(
        s[k] for k in ("color", "bgcolor", "bold", "italic", "underline")
    )


@simplefilter
def _unstyled_as_text(self, lexer, stream, options):
    """Tokens the style does not colour (names, punctuation, spaces) are written without a span,
    which halves the bytes of highlighted code (docs/LOG.md)."""
    for ttype, value in stream:
        yield (Token.Text if _plain(ttype) else ttype), value


_PYTHON = PythonLexer(stripnl=False)
_PYTHON.add_filter(_unstyled_as_text())
_YAML = YamlLexer()
_YAML.add_filter(_unstyled_as_text())
_TEMPLATES = Path(__file__).parent / "templates"


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of a run's Chains and Skills tabs: a run of whole groups of one section."""

    id: str
    label: str
    section: SectionView
    groups: tuple[GroupView, ...]
    skills: tuple[tuple[GroupView, tuple[SkillView, ...]], ...]


@dataclasses.dataclass(frozen=True)
class RunPage:
    prefix: str
    label: str
    run: RunData
    overview: OverviewView
    sections: tuple[SectionView, ...]
    pages: tuple[Page, ...]
    library: tuple[tuple[str, int, int, int, float | None], ...]  # name, versions, uses, successes, rate

    @property
    def problems(self) -> tuple[str, ...]:
        return self.run.problems


def run_page(run: RunData, prefix: str, label: str, page_size: int) -> RunPage:
    problems = list(run.problems)
    if run.kind == "collect":
        sections = collect_sections(run, prefix)
    else:
        opts = ChainOptions.from_config(
            run.config, run.kind == "train", problems, str(run.path / "config.yaml")
        )
        sections = [section_view(s, prefix, opts, problems) for s in run.sections]
        if run.kind == "train":
            by_step = {f"{prefix}-{s.key}": step_stats(run, s.step) for s in run.sections}
            sections = [dataclasses.replace(v, stats=by_step.get(v.id, ())) for v in sections]
    run = dataclasses.replace(run, problems=tuple(problems))
    return RunPage(
        prefix,
        label,
        run,
        overview(run),
        tuple(sections),
        tuple(paginate(sections, page_size, prefix)),
        library_summary(sections),
    )


def paginate(sections: Sequence[SectionView], page_size: int, prefix: str) -> list[Page]:
    """Cut each section into pages of whole groups holding at most ``page_size`` trajectories."""
    pages = []
    for s in sections:
        skills = dict(s.skills)
        chunks: list[list[GroupView]] = [[]]
        for g in s.groups:
            if chunks[-1] and sum(x.size for x in chunks[-1]) + g.size > page_size:
                chunks.append([])
            chunks[-1].append(g)
        for i, chunk in enumerate(chunks):
            label = s.label if len(chunks) == 1 else f"{s.label} ({i + 1}/{len(chunks)})"
            pages.append(
                Page(
                    f"pg-{prefix}-{len(pages)}",
                    label,
                    s,
                    tuple(chunk),
                    tuple((g, skills.get(g.id, ())) for g in chunk),
                )
            )
    return pages


def library_summary(sections: Sequence[SectionView]):
    """Per skill name over the whole run: versions saved, uses, successes when used, success rate."""
    acc: dict[str, list[int]] = {}
    for s in sections:
        for _, skills in s.skills:
            for sk in skills:
                a = acc.setdefault(sk.name, [0, 0, 0])
                a[0] += sum(v.status != "start library" for v in sk.versions)
                a[1] += len(sk.uses)
                a[2] += sum(u.success for u in sk.uses)
    return tuple(
        (n, v, u, ok, ok / u if u else None)
        for n, (v, u, ok) in sorted(acc.items(), key=lambda kv: -kv[1][1])
    )


# --------------------------------------------------------------------------------------------
# Filters
# --------------------------------------------------------------------------------------------


def code_html(code: str, defs: Sequence[str] = (), calls: Sequence[str] = ()) -> Markup:
    """Highlighted Python; lines defining ``defs`` or calling ``calls`` are marked."""
    lines = highlight(code, _PYTHON, _FORMATTER).rstrip("\n").split("\n")
    src = code.rstrip("\n").split("\n")
    def_re = re.compile(rf"^\s*(async\s+)?def\s+({'|'.join(map(re.escape, defs))})\b") if defs else None
    call_re = re.compile(rf"\b({'|'.join(map(re.escape, calls))})\s*\(") if calls else None
    out = []
    for i, line in enumerate(lines):
        text = src[i] if i < len(src) else ""
        if def_re and def_re.search(text):
            line = f'<span class="mark-def">{line}</span>'
        elif call_re and call_re.search(text):
            line = f'<span class="mark-call">{line}</span>'
        out.append(line)
    return Markup('<pre class="hl">' + "\n".join(out) + "</pre>")


def turn_code(turn: TurnView, traj: TrajView) -> Markup:
    """A turn's cell, marking the definitions of skills it saved and calls of library skills."""
    calls = {c.name for c in turn.calls} | {s.label for s in traj.used}
    return code_html(turn.code or "", [name for name, _ in turn.defines], sorted(calls))


def yaml_html(text: str) -> Markup:
    return Markup('<pre class="hl">' + highlight(text, _YAML, _FORMATTER) + "</pre>")


def clip(text: str, limit: int) -> Markup:
    """Escaped text, cut to ``limit`` characters with a note saying how much was left out."""
    if limit and len(text) > limit:
        rest = len(text) - limit
        return Markup(
            html.escape(text[:limit]) + f'<span class="clip">… {rest:,} more characters not shown</span>'
        )
    return Markup(html.escape(text))


def signed(v: float | None, spec: str = "{:+.2f}") -> str:
    return "-" if v is None else spec.format(v)


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


# --------------------------------------------------------------------------------------------


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(code=code_html, turn_code=turn_code, yaml=yaml_html, clip=clip, signed=signed, pct=pct)
    return env


def render(runs: Sequence[RunPage], comparison: CompareView | None, max_chars: int) -> str:
    css = (_TEMPLATES / "view.css").read_text() + HtmlFormatter(style=STYLE).get_style_defs(".hl")
    return (
        environment()
        .get_template("view.html.j2")
        .render(
            runs=runs,
            comparison=comparison,
            max_chars=max_chars,
            css=Markup(css),
            script=Markup((_TEMPLATES / "view.js").read_text()),
            generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        )
    )


def build_html(
    run_dir: str | Path, other: str | Path | None = None, page_size: int = 100, max_chars: int = 4000
) -> tuple[str, list[RunPage]]:
    """The page of ``run_dir`` (and ``other``, side by side, with a Compare tab). Always valid
    UTF-8: a lone surrogate that a record kept (``text.dumps``) is shown as U+FFFD."""
    paths = [Path(run_dir)] + ([Path(other)] if other is not None else [])
    labels = _labels(paths)
    runs = [
        run_page(read_run(p), prefix, label, page_size)
        for p, prefix, label in zip(paths, "ab", labels, strict=False)
    ]
    comparison = None
    if len(runs) == 2:
        (sa, scope_a), (sb, scope_b) = (compared_sections(r.run.kind, r.sections) for r in runs)
        comparison = compare((runs[0].label, runs[1].label), sa, sb, (scope_a, scope_b))
    return valid_text(render(runs, comparison, max_chars)), runs


def _labels(paths: Sequence[Path]) -> list[str]:
    names = [p.resolve().name or str(p) for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.resolve().parent.name}/{p.resolve().name}" for p in paths]
    if len(set(names)) < len(names):
        names = [f"{n} ({letter.upper()})" for n, letter in zip(names, "ab", strict=False)]
    return names

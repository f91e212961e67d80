"""``sage-rl view`` (issue 15): pages of real runs (a scripted evaluation, a collection, a tiny
training run; ``view_support.py``) read back through an HTML parser. Every trajectory is there,
every link resolves, and a skill's maker and users link to the right tasks. Bad input:
``test_view_damage.py``."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from view_support import Page, assert_links_resolve, build, chains_of, cli, records, view

from sage_rl.types import Outcome, Turn
from sage_rl.view.chains import ChainOptions, section_view
from sage_rl.view.read import ChainSection


@pytest.fixture(scope="module")
def eval_page(eval_run) -> Page:
    return view(eval_run)[0]


def test_every_trajectory_is_on_the_page_and_every_link_resolves(eval_run, eval_page):
    page = eval_page
    recs = records(chains_of(eval_run / "trajectories.same_scenario.jsonl"), "same_scenario")
    assert len(recs) == 9
    assert page.trajs == {tid: t.task.task_id for tid, t in recs.items()}
    assert_links_resolve(page)
    for tab in ("tab-overview", "tab-a-chains", "tab-a-skills"):
        assert tab in page.ids


def test_skill_users_link_to_the_task_that_made_the_skill(eval_run, eval_page):
    page = eval_page
    recs = records(chains_of(eval_run / "trajectories.same_scenario.jsonl"), "same_scenario")
    uses = [a for a in page.links if a.traj and "use" in a.cls.split() and "-def-" in a.target]
    # each use of a library skill (trajectory header and each cell's call records) is a link
    assert len({(a.traj, a.target) for a in uses}) == sum(len(t.skills_used) for t in recs.values()) > 0
    for a in uses:
        user, maker = recs[a.traj], recs[page.ids[a.target]]
        name = a.target.rsplit("-def-", 1)[1]
        assert name in user.skills_used and name in maker.skills_saved
        assert maker.task.scenario_id == user.task.scenario_id and maker.task.position < user.task.position
    # the Skills tab: each skill's entry links to its maker's definition and to every user
    for tid, t in recs.items():
        chain = tid.rsplit("-k", 1)[0]
        for name in t.skills_used:
            links = [a for a in page.links if a.skill == f"{chain}-skill-{name}"]
            assert tid in {a.target for a in links}
            assert any(a.target.endswith(f"-def-{name}") for a in links)


def test_large_runs_are_cut_into_pages_and_links_still_resolve(eval_run):
    page, _ = build(eval_run, page_size=3)
    assert page.templates == 2 * 2  # 3 scenarios of 3 tasks: 3 pages per tab, 2 of them parked
    assert len(page.trajs) == 9
    assert_links_resolve(page)


def test_compare_two_runs_task_by_task(eval_run, tmp_path):
    other = tmp_path / "no_skills"
    r = cli(
        "eval", "policy.kind=scripted", "limit_scenarios=3", "skills.use_skills=false", f"out_dir={other}"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    page, _ = view(eval_run, str(other))
    assert len(page.trajs) == 18 and "tab-compare" in page.ids
    assert_links_resolve(page)
    b = {
        k.replace("a-", "b-", 1): t
        for k, t in records(chains_of(other / "trajectories.same_scenario.jsonl"), "same_scenario").items()
    }
    assert {k: t.task.task_id for k, t in b.items()} == {
        k: v for k, v in page.trajs.items() if k.startswith("b-")
    }
    compare_links = [a for a in page.links if a.traj is None and a.skill is None and a.target in page.trajs]
    by_side = {
        side: {page.trajs[a.target] for a in compare_links if a.target.startswith(side)} for side in "ab"
    }
    assert by_side["a"] == by_side["b"] == {t.task.task_id for t in b.values()}


def test_rewards_and_advantages_of_a_training_group_match_hand_worked_numbers(eval_run):
    """Two chains of one task sequence (K=2). Chain 0 solves both and task 2 uses task 1's skill;
    chain 1 scores 0.5 then 0. Skill-integrated rewards: chain 0 (1+1, 1+1) = (2, 2), chain 1
    (0.5, 0). Advantages, mean baseline per position: (2 - 1.25, 0.5 - 1.25) = (0.75, -0.75) and
    (2 - 1, 0 - 1) = (1, -1)."""
    real = chains_of(eval_run / "trajectories.same_scenario.jsonl")[0]
    two = dataclasses.replace(real, trajectories=real.trajectories[:2], used_from=((), (0,)))
    fail = [Outcome(0.5, False), Outcome(0.0, False)]
    worse = dataclasses.replace(
        two,
        chain_index=1,
        used_from=((), ()),
        trajectories=tuple(
            dataclasses.replace(t, outcome=o, skills_used=())
            for t, o in zip(two.trajectories, fail, strict=True)
        ),
    )
    cfg = {"rollout": {"chain_length": 2, "group_size": 2}}
    opts = ChainOptions.from_config(cfg, train=True, problems=[])
    view_ = section_view(ChainSection("step 1", "s1", Path("x"), (two, worse), step=1), "a", opts, [])
    got = [(t.reward, t.advantage) for c in view_.groups[0].chains for t in c.trajectories]
    assert got == [(2.0, 0.75), (2.0, 1.0), (0.5, -0.75), (0.0, -1.0)]
    # a group missing one of its G chains (an unreadable line) keeps rewards, drops advantages
    partial = section_view(ChainSection("step 1", "s1", Path("x"), (two,), step=1), "a", opts, [])
    assert [(t.reward, t.advantage) for t in partial.groups[0].chains[0].trajectories] == [(2.0, None)] * 2


def test_start_library_skills_and_hostile_text_are_shown_safely(eval_run, tmp_path):
    """A skill from a start library (``eval library_store=...``) has no maker in the run: users link
    to its Skills entry. Agent-written text is escaped, whatever it holds."""
    from sage_rl.text import dumps

    chain = chains_of(eval_run / "trajectories.same_scenario.jsonl")[0]
    first, *rest = chain.trajectories
    hostile = "</pre></template><script>alert(1)</script>"
    # built through Turn.from_dict from the plain layout, which it keeps reading
    turn = Turn.from_dict(
        {
            "gen_ids": [],
            "gen_logprobs": [],
            "text": hostile,
            "code": f"print({hostile!r})",
            "observation": hostile,
        }
    )
    first = dataclasses.replace(
        first, library_in=("stored",), skills_used=("stored",), turns=(turn, *first.turns[1:])
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text((eval_run / "config.yaml").read_text())
    (run / "trajectories.same_scenario.jsonl").write_text(
        dumps(dataclasses.replace(chain, trajectories=(first, *rest)))
    )
    page, html = build(run)
    assert_links_resolve(page)
    stored = [a for a in page.links if a.target.endswith("-skill-stored")]
    assert stored and all(a.traj == "a-same_scenario-g0-c0-k0" for a in stored)
    assert "start library" in html and hostile not in html and html.count("<script>") == 1


def test_a_collection_shows_every_task_and_the_kept_conversations(collect_run):
    out = collect_run
    page, text = build(out)
    ledger = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()[1:]]
    tasks = [t for job in ledger for t in job["tasks"]]
    assert sorted(page.trajs.values()) == sorted(t["task_id"] for t in tasks)
    assert_links_resolve(page)
    assert text.count("kept in the dataset") == sum(t["reason"] is None for t in tasks)
    for reason in {t["reason"] for t in tasks} - {None}:
        assert f"dropped: {reason}" in text


def test_a_training_run_shows_each_step_with_rewards_and_advantages(train_run):
    page, text = build(train_run)
    recs = {}
    for step in (1, 2):
        recs |= records(chains_of(train_run / "rollouts" / f"step_{step:06d}.jsonl"), f"s{step}")
    assert page.trajs == {k: t.task.task_id for k, t in recs.items()} and len(recs) == 2 * 2 * 2
    assert_links_resolve(page)
    # the random tiny model writes no code: R = -1 (no-code penalty) and A = 0 for every sample
    assert text.count('"badge">R -1.00<') == len(recs) and text.count('"badge">A +0.00<') == len(recs)
    assert "Evaluation on train_val, before and after training" in text and "data:image/svg+xml;base64," in text
    # eval.keep=best: the random model scores 0 at every evaluation, so the start (step 0) is kept
    assert "kept model" in text and "step 0: TGC 0.0%, SGC 0.0% on train_val (best/)" in text


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs Debian's chromium (apt-get install chromium)"
)
def test_the_page_renders_in_headless_chromium_and_links_open_parked_pages(eval_run, tmp_path):
    _, text = build(eval_run, page_size=3)
    html = tmp_path / "view.html"
    html.write_text(text)
    target = "a-same_scenario-g2-c0-k1"  # on the third page: parked in a <template> until needed
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,900"]
    dom = subprocess.run(
        [*base, "--dump-dom", f"file://{html}#{target}"], capture_output=True, text=True, timeout=120
    ).stdout
    page = Page(dom)
    assert page.opened == {target}  # found, its page taken out of the template, and opened
    assert page.templates == 2 * 2 - 1 and target not in page.parked
    png = tmp_path / "shot.png"
    subprocess.run([*base, f"--screenshot={png}", f"file://{html}"], capture_output=True, timeout=120)
    from PIL import Image

    gray = Image.open(png).convert("L")
    assert gray.size == (1200, 900) and len(set(gray.getdata())) > 20  # not a blank page

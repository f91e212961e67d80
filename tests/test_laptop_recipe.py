"""benchmarks/laptop_recipe.py --quick: SFT, SAGE and the paper's controls at toy size with the tiny
model (issue 27): every arm's config is what it claims, the results JSON has the issue's keys, the
RL arms stop at equal sampled tokens, each learning curve starts from its own start model, and a
stopped run resumes without redoing a stage."""

import json
from pathlib import Path

import pytest
import yaml
from bench_script import load

from sage_rl.envs.pocketworld import tasks
from sage_rl.recipe.controls import MODELS, NO_LIBRARY, RL_START, screened_templates
from sage_rl.recipe.pipeline import RecipeError
from sage_rl.recipe.share import share_sft_stages, shared_stages

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("tgc", "sgc", "steps", "tokens")


def _bench():
    return load("laptop_recipe")


def _cfg(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_quick_laptop_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's `extends` and default paths are relative to the repository
    bench, out = _bench(), tmp_path / "lr"
    # stopped after the SFT models: base, sft (with and without its library) and sft_inline
    part = bench.main(["--quick", "--out", str(out), "--until", "sft"])
    assert part["models"] == ["base", "sft", "sft_nolib", "sft_inline"]
    assert "heldout_tgc_sft_minus_base" in part and "heldout_tgc_sft_minus_sft_nolib" in part
    assert part["heldout_tgc_sft_minus_sft_inline_ci"] is not None  # the two RL starts' gap
    assert "heldout_tgc_sage" not in part and part["sampled_tokens_sage"] is None
    assert not (out / "sage").exists() and not (out / "grpo_nolib").exists()
    made = [(out / p).stat().st_mtime_ns for p in ("eval/sft_nolib_dev/outcomes.json",
            "expert_inline/summary.json", "eval/sft_inline_dev/outcomes.json", "eval/base_dev/outcomes.json")]  # fmt: skip
    assert made == sorted(made)  # the base model's reference row last
    state = {s["name"]: s["state"] for s in bench.main(["--status", "--out", str(out)])["status"]}
    before_rl = [
        "collect", "sft", *(f"eval {m} {s}" for m in ("sft", "sft_nolib") for s in ("train_heldout", "dev")),
        "collect inline", "sft inline", "eval sft_inline train_heldout", "eval sft_inline dev",
        "eval base train_heldout", "eval base dev",
    ]  # fmt: skip
    assert {k for k, v in state.items() if v == "done"} == set(before_rl)  # --until sft: no RL arm
    assert list(state) == [  # in the order they run: what each tells per hour, base last
        *before_rl[:6],
        "rl sage", *(f"eval {m} {s}" for m in ("sage", "sage_nolib") for s in ("train_heldout", "dev")),
        "rl grpo_lib", "eval grpo_lib train_heldout", "eval grpo_lib dev",
        *before_rl[6:10],
        "rl grpo_nolib", "eval grpo_nolib train_heldout", "eval grpo_nolib dev",
        *before_rl[10:],
    ]  # fmt: skip
    row = bench.main(["--quick", "--out", str(out)])
    assert {s["state"] for s in bench.main(["--status", "--out", str(out)])["status"]} == {"done"}
    order = ("eval/sage_nolib_dev/outcomes.json", "grpo_lib/config.yaml", "eval/grpo_lib_dev/outcomes.json",
             "grpo_nolib/config.yaml")  # fmt: skip
    written = [(out / p).stat().st_mtime_ns for p in order]
    assert written == sorted(written)  # as listed: SAGE's figures, then grpo_lib's, then grpo_nolib's
    assert json.loads((out / "laptop_recipe.json").read_text()) == json.loads(json.dumps(row))
    assert row["models"] == list(MODELS)

    # every key the issue asks for, on both splits
    for split in ("heldout", "dev"):
        assert row[f"{split}_tasks"] == 3  # one scenario of each at toy size
        for model in MODELS:
            for metric in METRICS:
                assert row[f"{split}_{metric}_{model}"] is not None, (split, metric, model)
                lo, hi = row[f"{split}_{metric}_{model}_ci"]
                assert lo <= row[f"{split}_{metric}_{model}"] <= hi, (split, metric, model)
            usage = row[f"{split}_skill_usage_{model}"]
            assert (usage is None) == (model in NO_LIBRARY), model  # n/a without a library, not 0
        for other in ("sft", "grpo_nolib", "grpo_lib", "sage_nolib"):
            for metric in METRICS:
                key = f"{split}_{metric}_sage_minus_{other}"
                assert row[key] is not None and len(row[f"{key}_ci"]) == 2, key

    # the arms are what they claim
    lib, inline = _cfg(out / "expert" / "config.yaml"), _cfg(out / "expert_inline" / "config.yaml")
    assert lib["skills"]["use_skills"] and not inline["skills"]["use_skills"]
    assert inline["num_scenarios"] >= lib["num_scenarios"] and inline["seed"] == lib["seed"]
    # the same number of examples: the library-free expert collected at least as many, SFT took that many
    n = row["sft"]["sft"]["collected"]["examples"]
    assert row["sft"]["sft_inline"]["collected"]["examples"] >= n
    assert _cfg(out / "sft_inline" / "config.yaml")["data"]["limit"] == n
    sizes = [json.loads((out / m / "result.json").read_text()) for m in ("sft", "sft_inline")]
    assert [s["train_examples"] + s["eval_examples"] for s in sizes] == [n, n]
    data = [json.loads(x) for x in (out / "expert_inline" / "sage_expert.jsonl").read_text().splitlines()]
    assert data and not any("def " in json.dumps(d) for d in data)  # the library-free expert
    assert _cfg(out / "sft_inline" / "config.yaml")["optim"] == _cfg(out / "sft" / "config.yaml")["optim"]
    arms = {name: _cfg(out / name / "config.yaml") for name in RL_START}
    for name, c in arms.items():
        assert c["init_from"] == str(out / RL_START[name] / "final"), name
        assert c["sampled_token_budget"] == row["sampled_token_budget"]
        assert c["rollout"]["group_size"] == arms["sage"]["rollout"]["group_size"]
        assert c["trainer"] == arms["sage"]["trainer"]
        assert c["sampling"] == arms["sage"]["sampling"] and c["sampling"]["temperature"] == 0.5  # one setting
    sage, k = arms["sage"]["rollout"], arms["sage"]["rollout"]["chain_length"]
    assert k == 2 and sage["reward"] == "skill_integrated" and arms["sage"]["skills"]["use_skills"]
    for name, uses in (("grpo_lib", True), ("grpo_nolib", False)):
        r = arms[name]["rollout"]
        assert r["chain_length"] == 1 and r["reward"] == "outcome", name
        assert r["groups_per_step"] == k * sage["groups_per_step"], name  # the same task samples a step
        assert arms[name]["skills"]["use_skills"] is uses, name
    evals = {m: _cfg(out / "eval" / f"{m}_train_heldout" / "config.yaml") for m in MODELS}
    for m, c in evals.items():
        assert c["skills"]["use_skills"] is (m not in NO_LIBRARY), m
        assert c["sampling"]["temperature"] == 0.0, m
    assert (
        evals["sft_nolib"]["policy"]["model"] == evals["sft"]["policy"]["model"] == str(out / "sft" / "final")
    )
    assert evals["sage_nolib"]["policy"]["model"] == evals["sage"]["policy"]["model"]
    assert evals["sage"]["policy"]["model"].startswith(str(out / "sage" / "best"))  # eval.keep: best
    # an arm that kept its start's weights (best: step 0) reads its start's evaluation back (recipe/twins.py)
    for name, start in {**RL_START, "sage_nolib": "sft_nolib"}.items():
        arm = "sage" if name == "sage_nolib" else name
        kept_start = json.loads((out / arm / "best" / "best.json").read_text())["step"] == 0
        folder, source = (out / "eval" / f"{m}_train_heldout" for m in (name, start))
        assert (folder / "same_as.json").is_file() is kept_start, name
        assert (row["evaluations_read_back"].get(folder.name) == source.name) is kept_start, name  # in the results
        if kept_start:
            assert json.loads((folder / "same_as.json").read_text())["evaluation"] == str(source)
            assert json.loads((folder / "outcomes.json").read_text()) == json.loads((source / "outcomes.json").read_text())

    # equal sampled tokens: each arm stops at the first step that reaches the same budget
    budget, saved = row["sampled_token_budget"], 0
    for name in RL_START:
        rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
        totals = [r["sampled_tokens_total"] for r in rows if "sampled_tokens_total" in r]
        assert totals[-1] == row[f"sampled_tokens_{name}"] >= budget and all(t < budget for t in totals[:-1])
        first_step = next(r for r in rows if "sampled_tokens_total" in r)  # after the start's evaluation
        assert (out / name / "screens.jsonl").is_file() and "pool/size" in first_step  # the screened pool
        # where the gain lies: on the templates the arm's screens drew, and off them (two templates here)
        assert row[f"pool_templates_{name}"] == sorted(screened_templates(out / name))
        assert all(f"heldout_tgc_{name}_minus_{RL_START[name]}_{p}" in row for p in ("pool", "offpool"))
        # the curve starts from this arm's own start model on the loop's validation scenarios: its
        # step-0 evaluation there (train_val: the recipe reports no evaluation of that split)
        start = json.loads((out / name / "evals" / "step_000000.json").read_text())
        assert {sc for _, sc, _ in start["outcomes"]} == {start["outcomes"][0][1]}  # eval.scenarios=1
        assert start["outcomes"][0][0].split("-s")[0] in ("notes_count_tag", "todo_count_open")
        assert int(start["outcomes"][0][1].split("-s")[1]) in tasks.VALIDATION_SEEDS
        assert row["curves"][name][0] == [0, start["metrics"]["tgc"]]
        # the model it ends with: the best of its evaluations (TGC, then SGC; a tie keeps the earlier)
        scored = {int(p.stem[5:]): json.loads(p.read_text())["metrics"] for p in (out / name / "evals").iterdir()}
        top = max(scored, key=lambda s: (scored[s]["tgc"], scored[s]["sgc"], -s))
        assert row[f"rl_kept_{name}"] == {"step": top, "tgc": scored[top]["tgc"], "sgc": scored[top]["sgc"]}
        assert row["curves"][name][-1][0] == totals[-1]
        # the same curve paired with its start on the same tasks, from the loop's saved outcomes
        paired, points = row["curves_paired"][name], row["curves"][name][1:]
        assert [p[0] for p in paired] == [p[0] for p in points]
        assert all(lo <= d <= hi for _, d, lo, hi in paired)
        assert [d for _, d, *_ in paired] == pytest.approx([t - row["curves"][name][0][1] for _, t in points])
        steps = [r["step"] for r in rows if r.get("eval/tgc") is not None]
        assert [json.loads((out / name / "evals" / f"step_{s:06d}.json").read_text())["metrics"]["tgc"]
                for s in steps] == [r["eval/tgc"] for r in rows if r.get("eval/tgc") is not None]  # fmt: skip
        saved += len(steps)
    assert saved  # some arm evaluated between its steps, so the saved outcomes were read
    assert (out / "laptop_recipe.png").stat().st_size > 10_000

    # a rerun finds every stage done (nothing is trained or evaluated again) and reports the same
    again = bench.main(["--quick", "--out", str(out)])
    volatile = ("machine", "times_s")
    assert {k: v for k, v in again.items() if k not in volatile} == {
        k: v for k, v in row.items() if k not in volatile
    }
    assert all(t < 5 for t in again["times_s"].values())

    # another RL setting from the same SFT start: the stages before RL linked, SAGE's arm only
    other = tmp_path / "t05"
    hot = bench.main(["--quick", "--sft-from", str(out), "--out", str(other), "--until", "sage",
                      "sampling.temperature=0.7"])  # fmt: skip
    assert (other / "sft").is_symlink() and (other / "sft").resolve() == (out / "sft").resolve()
    assert hot["models"] == ["base", "sft", "sft_nolib", "sft_inline", "sage", "sage_nolib"]
    assert hot["sft_from"] == str(out) and hot["rl"]["temperature"] == 0.7
    assert hot["heldout_tgc_sft"] == row["heldout_tgc_sft"] and hot["sft"] == row["sft"]  # read back
    assert hot["heldout_tgc_sage_minus_sft_ci"] is not None and "heldout_tgc_sage_minus_grpo_lib" not in hot
    sage_cfg = _cfg(other / "sage" / "config.yaml")
    assert sage_cfg["sampling"]["temperature"] == 0.7 and sage_cfg["init_from"] == str(other / "sft" / "final")
    assert not (other / "grpo_lib").exists() and not (other / "grpo_nolib").exists()
    state = {s["name"]: s["state"] for s in bench.main(["--status", "--out", str(other)])["status"]}
    pending = [k for k, v in state.items() if v == "pending"]  # the GRPO arms' (the linked stages done)
    assert pending == ["rl grpo_lib", "eval grpo_lib train_heldout", "eval grpo_lib dev",
                       "rl grpo_nolib", "eval grpo_nolib train_heldout", "eval grpo_nolib dev"]  # fmt: skip


def test_sft_from_refuses_an_unfinished_run_and_a_folder_in_the_way(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    src, out = tmp_path / "src", tmp_path / "out"
    (src / "sft").mkdir(parents=True)
    with pytest.raises(SystemExit):
        _bench().main(["--quick", "--sft-from", str(src), "--out", str(out)])
    assert "missing expert/summary.json, sft/result.json" in capsys.readouterr().err
    assert not (out / "sft").exists()  # nothing linked, nothing run
    for name, done in shared_stages(["train_heldout", "dev"]).items():
        (src / name).mkdir(parents=True, exist_ok=True)
        (src / name / done).write_text("{}")
    (out / "sft").mkdir(parents=True)  # a folder of its own in the way: never replaced
    with pytest.raises(SystemExit):
        _bench().main(["--quick", "--sft-from", str(src), "--out", str(out)])
    assert f"{out / 'sft'} already exists and is not a link" in capsys.readouterr().err
    assert not (out / "expert").exists()  # checked before anything is linked
    assert share_sft_stages(src, tmp_path / "fresh", ["train_heldout", "dev"])  # links made
    assert share_sft_stages(src, tmp_path / "fresh", ["train_heldout", "dev"]) == []  # again: none


def test_a_signal_in_sft_ends_the_run_in_one_line(tmp_path, monkeypatch, capsys):
    """SIGTERM in SFT (laptop34, 2026-12-07) printed a traceback; it ends in one line, exit 130."""
    from sage_rl.train.sft_resume import SFTStopped

    monkeypatch.chdir(ROOT)
    bench = _bench()

    def stopped(*args, **kwargs):
        raise SFTStopped("SFT stopped by a signal after step 69 of 80; it resumes there")

    monkeypatch.setattr(bench, "run", stopped)
    with pytest.raises(SystemExit) as e:
        bench.main(["--quick", "--out", str(tmp_path / "lr"), "--until", "sft"])
    err = capsys.readouterr().err
    assert e.value.code == 130 and "after step 69 of 80" in err and "goes on" in err and "Traceback" not in err


def test_quick_never_writes_the_measured_results(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit):
        _bench().main(["--quick", "--out", str(tmp_path / "lr"), "--results", "docs/results"])
    assert not (tmp_path / "lr").exists()


def test_quick_laptop_recipe_side_by_side_headline_only(tmp_path, monkeypatch):
    """--parallel: evaluations run two at a time in two processes, each sampling on the cores the
    other leaves free (``policy.threads`` left unset: the engine's measured "auto"). --until sage on
    a fresh folder runs only the headline's stages (no base, no library-free SFT, no GRPO), and a
    later run without it would add them: --status lists them pending."""
    monkeypatch.chdir(ROOT)
    out, bench, released = tmp_path / "lr", _bench(), []
    real = bench.release_memory
    monkeypatch.setattr(bench, "release_memory", lambda: released.append(1) or real())
    row = bench.main(["--quick", "--parallel", "--out", str(out), "--until", "sage"])
    assert len(released) == len(row["times_s"]) == 5  # after every stage: collect, sft, 2 evals, rl
    assert row["models"] == ["sft", "sft_nolib", "sage", "sage_nolib"]
    assert {"eval sft", "eval sage"} <= set(row["times_s"]) and "eval base" not in row["times_s"]
    assert not (out / "expert_inline").exists() and not (out / "sft_inline").exists()
    assert not (out / "grpo_lib").exists() and not list((out / "eval").glob("base_*"))
    for name in row["models"]:
        for split in ("train_heldout", "dev"):
            folder = out / "eval" / f"{name}_{split}"
            assert (folder / "outcomes.json").is_file()
            assert _cfg(folder / "config.yaml")["policy"]["threads"] is None
    assert row["heldout_tasks"] == 3 and row["heldout_tgc_sage_minus_sft_ci"] is not None
    assert "heldout_tgc_sft_minus_base" not in row and row["sft"].keys() == {"sft"}
    state = {s["name"]: s["state"] for s in bench.main(["--status", "--out", str(out)])["status"]}
    pending = {k for k, v in state.items() if v == "pending"}
    assert pending == {
        "eval base train_heldout", "eval base dev", "collect inline", "sft inline",
        "eval sft_inline train_heldout", "eval sft_inline dev", "rl grpo_lib", "eval grpo_lib train_heldout",
        "eval grpo_lib dev", "rl grpo_nolib", "eval grpo_nolib train_heldout", "eval grpo_nolib dev",
    }  # fmt: skip


def test_sft_from_a_headline_only_run_serves_until_sage(tmp_path, monkeypatch, capsys):
    """A source run with ``--until sage`` has no base evaluation and no library-free SFT: a new
    ``--until sage`` run needs only its headline stages and links them (and nothing it lacks); a
    full new run still refuses it, naming what is missing."""
    monkeypatch.chdir(ROOT)
    splits = ["train_heldout", "dev"]
    src, out = tmp_path / "src", tmp_path / "out"
    with pytest.raises(SystemExit):  # the bench hands its --until on: only the headline is asked for
        _bench().main(["--quick", "--until", "sage", "--sft-from", str(src), "--out", str(out)])
    err = capsys.readouterr().err
    assert "missing expert/summary.json, sft/result.json, eval/sft_train_heldout/outcomes.json" in err
    assert "base" not in err and "inline" not in err and "--until sage first" in err
    for name, done in shared_stages(splits, headline_only=True).items():
        (src / name).mkdir(parents=True, exist_ok=True)
        (src / name / done).write_text("{}")
    (src / "eval" / "base_dev").mkdir()  # begun, not done: never linked
    with pytest.raises(RecipeError, match="eval/base_train_heldout/outcomes.json"):
        share_sft_stages(src, out, splits)
    links = share_sft_stages(src, out, splits, until="sage")
    assert sorted(str(p.relative_to(out)) for p in links) == [
        "eval/sft_dev", "eval/sft_nolib_dev", "eval/sft_nolib_train_heldout", "eval/sft_train_heldout",
        "expert", "sft",
    ]
    assert (out / "sft").resolve() == (src / "sft").resolve() and not (out / "eval" / "base_dev").exists()
    assert share_sft_stages(src, out, splits, until="sage") == []  # again: nothing new

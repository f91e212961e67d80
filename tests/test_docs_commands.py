"""Every ``sage-rl`` command shown in README.md and docs/*.md runs (issue 18).

The commands are read from the files at test time (doc_commands.py), so a command added to the
docs is checked from then on. Each runs in a process of its own (forked from one that has imported
torch, transformers and the commands: cli_server.py) in a smoke form: the same subcommand,
config and overrides, plus overrides that make it small (``SMALL``: the tiny model, one scenario,
one step, a temporary out_dir), in a scratch folder holding only a link to configs/ (so nothing
lands in the checkout). Stand-ins replace what CI lacks where a cheap one exists: a loopback
OpenAI-compatible server for ``policy.kind=openai``, AppWorld's synthetic world and bundle for
``env=appworld`` and ``sage-rl appworld``. Usage lines (``sage-rl world list [--split S]``) run in
their shortest form; every option they name must exist. ``NEEDS`` lists the commands CI cannot run
and why; those are still checked for existence, options and config, then reported as skipped.
A command the harness has no plan for fails, naming what to add.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from doc_commands import ROOT, DocCommand, Parsed, check_exists, commands, doc_files, is_placeholder, resolve
from doc_fixtures import (  # noqa: F401 - the fixtures the smoke forms use, by name
    AGENT,
    Fixtures,
    docs_appworld,
    docs_appworld_run,
    docs_eval_run,
    docs_openai,
    docs_sft_data,
    docs_skill_store,
    docs_tiny,
    docs_train_run,
    sage_cli,
)

from sage_rl.config import load_config
from sage_rl.integrations.verl.config import VerlRunConfig
from sage_rl.runs.console import split_args
from sage_rl.settings import CollectConfig, EvalRunConfig, TrainConfig
from sage_rl.train.sft_config import SFTConfig

#: Doc files whose commands are not checked, and why.
NOT_CHECKED = {
    "docs/LOG.md": "the experiment log records the commands as they were run then; it is history, "
    "and rewriting it to follow the code would falsify the record",
}
#: Commands CI cannot run, keyed by command path (plus an option where only that form needs it).
NEEDS = {
    ("verl", "train"): "GPUs, verl's GPU virtualenv (`scripts/setup_verl.sh --gpu`: vLLM, FSDP) and Ray "
    "(--address: a multi-node Ray cluster); CI has no GPU. Its config is validated here, and "
    "prepare-data of the same config runs below",
    ("appworld", "setup", "--download"): "the network: `appworld download data` fetches AppWorld's data "
    "from its server, and CI reaches only package registries (the --bundle form runs on a synthetic bundle)",
}
TASK = "music_follow_playlist_artists_1"  # TASK_ID in usage lines
CODE = "print(apis.supervisor.show_profile())\n"  # FILE of `world run --code FILE`
#: The config model and default config of the commands that take ``[CONFIG] [key=value ...]``.
CONFIGS = {
    ("eval",): (EvalRunConfig, "configs/eval.yaml"),
    ("train",): (TrainConfig, "configs/quickstart.yaml"),
    ("recipe",): (TrainConfig, "configs/quickstart.yaml"),
    ("collect",): (CollectConfig, "configs/collect.yaml"),
    ("sft",): (SFTConfig, "configs/sft.yaml"),
    ("verl", "prepare-data"): (VerlRunConfig, None),
    ("verl", "show-config"): (VerlRunConfig, None),
    ("verl", "train"): (VerlRunConfig, None),
}

# ---- smoke forms: a plan per command path, returning (argv, extra environment) ----------------


def _copy(src: Path, tmp: Path, name: str) -> str:
    """A private copy of a shared run folder (the command may write into it)."""
    dst = tmp / "runs" / name
    shutil.copytree(src, dst, symlinks=True)
    return str(dst)


def _flat(options: list[tuple[str, str | None]]) -> list[str]:
    return [x for o, v in options for x in (o, v) if x is not None]


def _policy(cfg: Any, fx: Fixtures) -> list[str]:
    if cfg.policy.kind == "transformers":
        return [f"policy.model={fx.tiny}"]
    if cfg.policy.kind == "openai":
        return [f"policy.base_url={fx.openai}", "policy.model=smoke-model"]
    return []  # scripted


def _overrides(p: Parsed, cfg: Any, fx: Fixtures) -> list[str]:
    """The overrides that make a config-driven command small."""
    out = f"out_dir={fx.tmp / 'out'}"
    if p.path == ("eval",):
        store = [f"library_store={fx.skill_store}"] if cfg.library_store else []
        return ["limit_scenarios=1", out, *AGENT, *_policy(cfg, fx), *store]
    if p.path == ("train",):
        resume = ("--resume", None) in p.options
        run = [f"out_dir={_copy(fx.train_run, fx.tmp, 'resumed')}", "steps=2"] if resume else [out, "steps=1"]
        small = ["rollout.group_size=2", "rollout.groups_per_step=1", "eval.scenarios=1", "init_from=null"]
        return [*run, *small, *AGENT, *_policy(cfg, fx)]
    if p.path == ("recipe",):  # every stage at toy size (tests/test_recipe.py runs it in full); the
        # main job's SFT freezes 10 layers, the tiny model has 2
        stages = ["steps=1", "rollout.group_size=2", "recipe.collect.num_scenarios=2", "recipe.sft.optim.max_steps=1",
                  "recipe.sft.eval_every=0", "recipe.eval.splits=[train_heldout]", "recipe.eval.scenarios=1",
                  "recipe.sft.optim.freeze_layers=1"]  # fmt: skip
        return [out, "pocketworld.sandbox=false", *stages, *AGENT, *_policy(cfg, fx)]
    if p.path == ("collect",):
        return ["num_scenarios=1", out, *AGENT, *_policy(cfg, fx)]
    if p.path == ("sft",):
        return [f"data.path={fx.sft_data}", f"model={fx.tiny}", f"output.dir={fx.tmp / 'out'}",
                "data.limit=4", "optim.max_steps=1", "optim.grad_accum=1"]  # fmt: skip
    if p.path == ("verl", "prepare-data"):  # in .venv: prepare-data needs no verl (docs/verl.md)
        return [f"data_dir={fx.tmp / 'data'}", "steps=1"]
    raise AssertionError(f"no smoke overrides for `sage-rl {' '.join(p.path)}`: add them to _overrides")


def _load(p: Parsed) -> tuple[Any, str | None, list[str]]:
    """(config, config file, overrides) of a config-driven command; a placeholder value is kept as
    the word PLACEHOLDER (``data.path=...`` is not even YAML) and must be set by the smoke form."""
    model, default = CONFIGS[p.path]
    config, overrides = split_args(p.positionals[0] if p.positionals else None, p.positionals[1:])
    overrides = [
        f"{o.partition('=')[0]}=PLACEHOLDER" if is_placeholder(o.partition("=")[2]) else o for o in overrides
    ]
    file = config or default
    return load_config(model, ROOT / file if file else None, overrides), config, overrides


def _config_command(p: Parsed, fx: Fixtures) -> tuple[list[str], dict[str, str]]:
    cfg, config, overrides = _load(p)
    smoke = _overrides(p, cfg, fx)
    for o in overrides:
        key = o.partition("=")[0]
        assert not o.endswith("=PLACEHOLDER") or any(s.startswith(f"{key}=") for s in smoke), (
            f"the placeholder of {key} needs a value: set {key} in _overrides"
        )
    env = {"SAGE_RL_APPWORLD_ROOT": str(fx.appworld)} if getattr(cfg, "env", None) == "appworld" else {}
    return [*p.path, *([config] if config else []), *overrides, *smoke, *_flat(p.options)], env


def _world(p: Parsed, fx: Fixtures) -> tuple[list[str], dict[str, str]]:
    code = fx.tmp / "cell.py"
    code.write_text(CODE)
    values = {"TASK_ID": TASK, "FILE": str(code), "S": "dev"}
    for t in [*p.positionals, *(v for _, v in p.options if v)]:
        assert not is_placeholder(t) or t in values, f"no smoke value for {t!r}: add it to _world"
    sub = lambda t: values.get(t, t)  # noqa: E731
    return [*p.path, *map(sub, p.positionals), *_flat([(o, v and sub(v)) for o, v in p.options])], {}


def _view(p: Parsed, fx: Fixtures) -> tuple[list[str], dict[str, str]]:
    """RUN_DIR, OTHER_RUN -> copies of a train run and an eval run; --out FILE -> the scratch folder."""
    runs = [_copy((fx.train_run, fx.eval_run)[i % 2], fx.tmp, f"run{i}") for i in range(len(p.positionals))]
    options = [(o, str(fx.tmp / Path(v).name) if o in ("--out", "-o") and v else v) for o, v in p.options]
    return ["view", *runs, *_flat(options)], {}


def _appworld(p: Parsed, fx: Fixtures) -> tuple[list[str], dict[str, str]]:
    """On AppWorld's synthetic world: setup from its bundle (copied to the path the doc gives, and
    its sha256), evaluate a run folder of `sage-rl eval configs/appworld_eval.yaml`, bench once."""
    from sage_rl.integrations.appworld.installer import sha256_of

    options, positionals = list(p.options), list(p.positionals)
    env = {"SAGE_RL_APPWORLD_ROOT": str(fx.appworld)}
    if p.path == ("appworld", "setup"):
        env = {"SAGE_RL_APPWORLD_ROOT": str(fx.tmp / "appworld-root")}  # a fresh one
        for i, (o, v) in enumerate(options):
            if o == "--bundle" and v:
                local = fx.tmp / (Path(v).name if v.startswith(("/", "~")) else v)
                local.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(fx.appworld / "bundle", local)
                options[i] = (o, v if local.name == v else str(local))
                options.append(("--sha256", sha256_of(local)))
    elif p.path == ("appworld", "evaluate"):
        positionals = [_copy(fx.appworld_run, fx.tmp, "appworld_eval")]
    elif p.path == ("appworld", "bench"):
        options = [(o, v) for o, v in options if o != "--repeats"] + [("--repeats", "1")]
    for t in positionals:
        assert not is_placeholder(t), f"no smoke value for {t!r}: add it to _appworld"
    return [*p.path, *positionals, *_flat(options)], env


def _choose(p: Parsed, fx: Fixtures) -> tuple[list[str], dict[str, str]]:
    """Each STEP=FOLDER -> STEP=a copy of an eval run (equal scores: the earliest step is kept), one
    more where a usage line's pairs end in ``...``."""
    steps = [t.partition("=")[0] for t in p.positionals if t != "..."]
    steps += ["more"] * ("..." in p.positionals)
    steps = [s if s.isdigit() else str(1000 + i) for i, s in enumerate(steps)]  # STEP -> a number
    pairs = [f"{s}={_copy(fx.eval_run, fx.tmp, f'ev{i}')}" for i, s in enumerate(steps)]
    return ["choose", *pairs, *_flat(p.options)], {}


#: How each command path is made to run (its own entry, else its group's).
PLANS: dict[tuple[str, ...], Callable[[Parsed, Fixtures], tuple[list[str], dict[str, str]]]] = {
    **{path: _config_command for path in CONFIGS},
    ("world",): _world,
    ("view",): _view,
    ("choose",): _choose,
    ("appworld",): _appworld,
}


#: An option whose value the smoke form replaces: commands that differ only there run once.
REPLACED = {("appworld", "bench"): "--repeats"}


def _key(doc: DocCommand) -> tuple[str, ...]:
    argv = doc.runnable or doc.argv
    try:
        option = REPLACED.get(resolve(argv).path)
    except AssertionError:  # no such command: its own case, where the test says so
        return argv
    drop = {i for i, t in enumerate(argv) if t == option} | {i + 1 for i, t in enumerate(argv) if t == option}
    return tuple(t for i, t in enumerate(argv) if i not in drop)


def _cases() -> list[Any]:
    """One case per distinct command to run, named by its first place in the docs."""
    cases: dict[tuple[str, ...], list[DocCommand]] = {}
    for f in doc_files():
        for c in commands(f):
            cases.setdefault(_key(c), []).append(c)
    return [pytest.param(docs, id=f"{docs[0].where} {' '.join(docs[0].argv)}") for docs in cases.values()]


@pytest.mark.parametrize("docs", _cases())
def test_a_doc_command_runs(docs: list[DocCommand], request: pytest.FixtureRequest, tmp_path: Path) -> None:
    for doc in docs:
        check_exists(doc)
    shown = f"{', '.join(d.where for d in docs)}: {docs[0].text}"
    if docs[0].runnable is None:
        return  # a list of subcommands, which all exist
    p = resolve(docs[0].runnable)
    if hasattr(p.command, "commands") or (
        not p.positionals and not p.options and any(a.required for a in p.command.params)
    ):
        return  # a command's name in prose ("`sage-rl appworld evaluate` runs ..."), which exists
    flags = [(*p.path, o) for o, _ in p.options]
    need = next((NEEDS[k] for k in (p.path, *flags) if k in NEEDS), None)
    if need:
        if p.path in CONFIGS:
            _load(p)  # what can be checked without it: the config and overrides are valid
        pytest.skip(f"{shown}: needs {need}")
    plan = PLANS.get(p.path) or PLANS.get(p.path[:1])
    assert plan, (
        f"{shown}: no smoke plan for `sage-rl {' '.join(p.path)}`: add one to PLANS, or list it in NEEDS"
    )
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    args, env = plan(p, Fixtures(request, tmp_path))
    r = sage_cli(args, tmp_path, env)
    assert r.returncode == 0, (
        f"{shown}\nran: sage-rl {' '.join(args)}\nexit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    )


# ---- the harness itself, and CI ---------------------------------------------------------------


def test_the_harness_reads_blocks_spans_and_module_forms(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `sage-rl eval\nsplit=dev` or `sage-rl_test` (a name), `sage-rl`.\n\n"
        "```bash\n"
        "bash scripts/setup.sh && OMP_NUM_THREADS=1 .venv/bin/sage-rl train configs/x.yaml \\\n"
        "    steps=3   # a comment -> runs/x\n"
        ".venv-verl/bin/python -m sage_rl.integrations.verl.main prepare-data c.yaml\n"
        "sage-rl sft data.path=<that jsonl> --json | tail -1\n"
        "sage-rl world run TASK_ID (--code FILE | --noop) [--json]\n"
        "vllm serve m &\n"
        "```\n"
    )
    import doc_commands

    monkey = pytest.MonkeyPatch()
    monkey.setattr(doc_commands, "ROOT", tmp_path)
    try:
        found = [(c.where, c.argv, c.runnable) for c in commands(page)]
    finally:
        monkey.undo()
    assert found == [
        ("page.md:1", ("eval", "split=dev"), ("eval", "split=dev")),
        ("page.md:5", ("train", "configs/x.yaml", "steps=3"), ("train", "configs/x.yaml", "steps=3")),
        ("page.md:7", ("verl", "prepare-data", "c.yaml"), ("verl", "prepare-data", "c.yaml")),
        ("page.md:8", ("sft", "data.path=PLACEHOLDER", "--json"), ("sft", "data.path=PLACEHOLDER", "--json")),
        (
            "page.md:9",
            ("world", "run", "TASK_ID", "(--code", "FILE", "|", "--noop)", "[--json]"),
            ("world", "run", "TASK_ID", "--code", "FILE"),
        ),
    ]
    with pytest.raises(AssertionError, match="no subcommand 'telepathy'"):
        resolve(("world", "telepathy"))
    with pytest.raises(AssertionError, match="no option '--colour'"):
        resolve(("view", "runs/x", "--colour"))


def test_every_doc_page_is_read_or_excused() -> None:
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    read = {p.relative_to(ROOT).as_posix() for p in doc_files()}
    assert pages - read == set(NOT_CHECKED) and "README.md" in read
    assert len(commands(ROOT / "README.md")) >= 10  # the quick start and the tour, at least


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run starts with the README's set-up-and-test command (it may add reporting flags)."""
    readme = [c for c in (ROOT / "README.md").read_text().splitlines() if "-m pytest" in c]
    assert len(readme) == 1, readme
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(readme[0].strip()) for line in ci), (readme[0], ci)

"""What each command does, below the command line (issue 31).

One run function per command, each taking its typed config and returning its result:

    runs/eval.py      run_evaluation(EvalRunConfig) -> EvalResult      sage-rl eval
    runs/train.py     run_train(TrainConfig, resume) -> summary        sage-rl train
    runs/collect.py   run_collect(CollectConfig) -> summary            sage-rl collect
    runs/sft.py       run_sft(SFTConfig) -> result                     sage-rl sft
    runs/console.py   the commands' stderr console, progress bars, config loading, one-line errors
    runs/claim.py     one process at a time in a run folder (each run function holds its own)

The commands in ``cli/`` parse their arguments, load the config, call one of these and map errors
to exit codes; the recipe (``recipe/``) and verl's entry point call them too, never ``cli``.
Submodules are imported by name (nothing here), so that a command pays only for what it runs.
"""

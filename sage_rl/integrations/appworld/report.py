"""AppWorld's own evaluation report of one experiment of a sage-rl run. Runs under the AppWorld venv.

    python report.py ROOT EXPERIMENT SPLIT [--no-sandbox]

ROOT is an AppWorld root (``RUN_DIR/appworld``: ``data`` and ``experiments/outputs``):
- when every task of SPLIT has outputs, AppWorld's ``evaluate_dataset``: exactly what
  ``appworld evaluate EXPERIMENT SPLIT`` runs;
- otherwise (a run over part of a split), AppWorld's ``evaluate_tasks`` over the tasks that have
  outputs, saved and printed as ``evaluate_dataset`` does (``evaluations/<SPLIT>.json`` and
  ``.txt`` in the experiment folder), after a line saying how many of the split's tasks it covers.

The outputs were written by agent code's process, so this runs under the sandbox's layers:
reads only the data, Python and venv folders, writes only the experiment folder, no network.
Imports nothing from sage_rl but the sandbox's layer modules (``layers.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0]) == _HERE:
    sys.path.pop(0)  # run as a script: siblings must not shadow AppWorld's imports


def _layers():
    spec = importlib.util.spec_from_file_location("sage_rl_appworld_layers", os.path.join(_HERE, "layers.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _isolate(experiment_dir: str, data: str) -> None:
    layers = _layers()
    network, _ = layers.enter_network_namespace()
    limits = layers.Limits(
        address_space_bytes=16 << 30,
        file_size_bytes=1 << 30,
        open_files=1024,
        episode_cpu_seconds=24 * 3600,
        threads=4096,
        drop_user="",
    )
    paths = layers.evaluator_paths(layers.readable_paths())
    report = layers.apply(limits, experiment_dir, network, paths, [data])
    print(
        f"(evaluated under: network={report['network']}, filesystem={report['filesystem']})", file=sys.stderr
    )


def main(root: str, experiment: str, split: str, sandbox: bool) -> None:
    os.environ["APPWORLD_ROOT"] = root
    outputs = os.path.join(root, "experiments", "outputs", experiment)
    data = os.path.realpath(os.path.join(root, "data"))
    from appworld.common.utils import write_file, write_json
    from appworld.evaluator import Metric, evaluate_dataset, evaluate_tasks
    from appworld.task import load_task_ids

    split_ids = load_task_ids(dataset_name=split)
    present = [t for t in split_ids if os.path.isdir(os.path.join(outputs, "tasks", t, "dbs"))]
    if sandbox:
        _isolate(outputs, data)
    if present == split_ids:
        evaluate_dataset(experiment_name=experiment, dataset_name=split)
        return
    print(f"partial run: {len(present)} of the {len(split_ids)} tasks of {split} have outputs")
    if not present:
        return
    evaluation = evaluate_tasks(task_ids=present, experiment_name=experiment)
    folder = os.path.join(outputs, "evaluations")
    os.makedirs(folder, exist_ok=True)
    write_json(evaluation, os.path.join(folder, f"{split}.json"), silent=True)
    from appworld.common.utils import table_data_to_string

    text = table_data_to_string(Metric.build_report(evaluation))
    write_file(text, os.path.join(folder, f"{split}.txt"))
    print("\nText Evaluation Report:")
    print(text)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--no-sandbox"]
    if len(args) != 3:
        sys.exit("usage: report.py ROOT EXPERIMENT SPLIT [--no-sandbox]")
    main(*args, sandbox="--no-sandbox" not in sys.argv)
    sys.stdout.flush()
    os._exit(0)  # AppWorld leaves non-daemon resources behind

"""Build a synthetic AppWorld world, for offline tests and benchmarks (runs in the AppWorld venv).

AppWorld's real task data cannot be downloaded everywhere (PLATFORM.md), so tests and the
benchmark run against a world made here from AppWorld's own code:
- API docs generated from the apps' source (``appworld.api_docs.prepare_api_docs``), written as
  ``data/api_docs/standard/<app>.json`` and loaded into the ``api_docs`` app's database;
- ``data/base_dbs``: every app's empty schema, made by AppWorld's ``ModelCollection`` (full
  SQLite files), with the API docs in the ``api_docs`` app's database;
- per task, ``dbs/<app>.jsonl``: the task's changes on top of the base DBs (AppWorld's "changes"
  format, as in its real data): the supervisor (admin ``MainUser`` and supervisor ``Supervisor``)
  and the active supervisor ``Task``. AppWorld saves a run's state in the same format, so its
  evaluator can score it from disk (``appworld evaluate``);
- a task folder: ``specs.json`` and a minimal ``ground_truth`` whose ``evaluation.py`` has two
  tests: "the task is marked complete" and "the answer is correct";
- ``data/datasets/<split>.txt``.

It can also pack ``<root>/data`` into a bundle with AppWorld's own ``pack_bundle`` (the format of
``data-0.1.0.bundle``: an AES-CFB-encrypted zip whose paths start with ``data/``).

Usage (AppWorld venv): ``python synthetic.py build ROOT SPEC.json`` where SPEC holds
``{"splits": {"train": [{"task_id", "instruction", "answer", ...}, ...], ...}}`` (see
``write_task_folder`` for the optional keys);
``python synthetic.py bundle ROOT OUT.bundle``. Imports nothing from sage_rl.
"""

from __future__ import annotations

import json
import os
import sys

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # run as a script: siblings must not shadow AppWorld's imports

SUPERVISOR = {
    "first_name": "Ada",
    "last_name": "Lovelace",
    "email": "ada.lovelace@example.com",
    "phone_number": "5550100199",
}
BIRTHDAY = "1990-12-10"
DATETIME = "2023-05-18T12:00:00"
REQUIREMENTS = ("the task is marked complete", "the answer is correct")
EVALUATION_PY = """import json


def evaluate(test, public_data, private_data, main_user, models, ground_truth_answer):
    task = models.end.supervisor.Task.all()[0]
    with test("the task is marked complete"):
        test.case(task.status, "==", "success")
    with test("the answer is correct"):
        test.answer(json.loads(task.answer), ground_truth_answer)
"""


def _dump(obj: object, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def write_api_docs(data: str) -> list[dict]:
    """Generate every app's API docs from source; return them as one list."""
    from appworld.api_docs import prepare_api_docs
    from appworld.apps import get_all_apps

    everything: list[dict] = []
    for app in get_all_apps(skip_admin=True):
        docs = prepare_api_docs(app)
        _dump(
            {d["api_name"]: {**d, "canary_string": ""} for d in docs}, f"{data}/api_docs/standard/{app}.json"
        )
        everything += docs
    return everything


def write_base_dbs(data: str, api_docs: list[dict]) -> None:
    """``data/base_dbs``: every app's empty schema (full SQLite files), with the API docs in the
    ``api_docs`` app's database. Tasks store only their changes on top of it, as in AppWorld's data."""
    from appworld.apps import get_all_apps
    from appworld.collections.models import ModelCollection

    memory = ":memory:synthetic-base"
    models = ModelCollection.load(
        to_db_home_path=memory, from_db_home_path=memory, load_apps=get_all_apps(), create_db=True
    )
    for doc in api_docs:
        models.api_docs.ApiDoc.create_save(
            app_name_=doc["app_name"],
            api_name=doc["api_name"],
            path=doc["path"],
            method=doc["method"],
            description=doc["description"],
            parameters=doc["parameters"],
            response_schemas=doc["response_schemas"],
        )
    models.save(db_home_path=f"{data}/base_dbs", format="full", delete_if_exists=True)
    models.close()


def write_task_dbs(data: str, task_id: str, instruction: str) -> None:
    """``data/tasks/<id>/dbs``: the task's changes (JSON lines per app) on top of the base DBs: the
    supervisor (admin ``MainUser`` and supervisor ``Supervisor``) and the active supervisor ``Task``."""
    from appworld.apps import get_all_apps
    from appworld.collections.models import ModelCollection

    models = ModelCollection.load(
        to_db_home_path=f":memory:synthetic-{task_id}",
        from_db_home_path=f"{data}/base_dbs",
        load_apps=get_all_apps(),
    )
    models.admin.MainUser.create_save(**SUPERVISOR, birthday=BIRTHDAY)
    supervisor = models.supervisor.Supervisor.create_save(**SUPERVISOR, birthday=BIRTHDAY)
    models.supervisor.Task.create_save(supervisor_id=supervisor.id, instruction=instruction)
    models.save(db_home_path=f"{data}/tasks/{task_id}/dbs", format="changes", delete_if_exists=True)
    models.close()


def write_task_folder(data: str, task: dict) -> None:
    """``specs.json`` and ``ground_truth``. Optional task keys: ``difficulty`` (1), ``db_version``
    (AppWorld's own; another makes the task fail to load) and ``evaluation_py`` (the ground
    truth's evaluation code; e.g. a broken one)."""
    from appworld.common.constants import DB_VERSION

    folder = f"{data}/tasks/{task['task_id']}"
    specs = {
        "instruction": task["instruction"],
        "supervisor": SUPERVISOR,
        "datetime": DATETIME,
        "db_version": task.get("db_version", DB_VERSION),
    }
    _dump(specs, f"{folder}/specs.json")
    gt = f"{folder}/ground_truth"
    meta = {
        "difficulty": task.get("difficulty", 1),
        "mode": "minimal",
        "num_apps": 1,
        "num_apis": 2,
        "num_api_calls": 2,
        "num_solution_code_lines": 2,
    }
    _dump(meta, f"{gt}/metadata.json")
    _dump({}, f"{gt}/public_data.json")
    _dump({}, f"{gt}/private_data.json")
    _dump(task["answer"], f"{gt}/answer.json")
    _dump([{"requirement": r, "label": "no_op_fail"} for r in REQUIREMENTS], f"{gt}/test_data.json")
    with open(f"{gt}/evaluation.py", "w") as f:
        f.write(task.get("evaluation_py", EVALUATION_PY))


def build(root: str, spec: dict) -> None:
    """Write ``<root>/data`` for the tasks of ``spec["splits"]`` (split name -> list of tasks)."""
    os.environ["APPWORLD_ROOT"] = root
    data = os.path.join(root, "data")
    write_base_dbs(data, write_api_docs(data))
    for split, tasks in spec["splits"].items():
        for t in tasks:
            write_task_dbs(data, t["task_id"], t["instruction"])
            write_task_folder(data, t)
        os.makedirs(f"{data}/datasets", exist_ok=True)
        with open(f"{data}/datasets/{split}.txt", "w") as f:
            f.write("".join(t["task_id"] + "\n" for t in tasks))


def bundle(root: str, out: str) -> None:
    """Pack ``<root>/data`` into ``out`` exactly as AppWorld packs its data bundle."""
    from appworld.common.constants import PASSWORD, SALT
    from appworld.common.utils import pack_bundle

    pack_bundle(out, base_directory=root, include_directories=["data"], password=PASSWORD, salt=SALT)


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[0] == "build":
        with open(argv[2]) as f:
            build(os.path.abspath(argv[1]), json.load(f))
    elif len(argv) == 3 and argv[0] == "bundle":
        bundle(os.path.abspath(argv[1]), os.path.abspath(argv[2]))
    else:
        sys.exit("usage: synthetic.py build ROOT SPEC.json | synthetic.py bundle ROOT OUT.bundle")
    sys.stdout.flush()
    os._exit(0)  # AppWorld leaves non-daemon resources behind


if __name__ == "__main__":
    main(sys.argv[1:])

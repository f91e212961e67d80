"""Chat records and their exports: JSON Lines, Hugging Face parquet, LLaMA-Factory sharegpt."""

from __future__ import annotations

import json

import pytest

from sage_rl.data.export import (
    ExportError,
    export_hf,
    export_sharegpt,
    read_hf,
    read_sharegpt,
    sharegpt_rows,
)
from sage_rl.data.records import (
    ChatExample,
    DatasetError,
    Message,
    episode_messages,
    example_from_trajectory,
    read_jsonl,
    write_jsonl,
)
from sage_rl.types import ExecResult, Outcome, StopReason, Task, Trajectory, Turn


def example(i: int = 0, trailing_obs: bool = False, temperature: float | None = 0.7) -> ChatExample:
    msgs = [
        Message("system", "You are an agent. Write Python."),
        Message("user", f"Task {i}: send ünïcode 'hi' to Bob."),
        Message("assistant", f"```python\nprint(apis.phone.contacts())  # {i}\n```"),
        Message("user", "[{'name': 'Bob'}]"),
        Message("assistant", "```python\napis.supervisor.complete_task()\n```"),
    ]
    if trailing_obs:
        msgs.append(Message("user", "Task completed."))
    return ChatExample(
        messages=tuple(msgs),
        policy="expert",
        temperature=temperature,
        scenario_id=f"sc{i}",
        task_id=f"sc{i}_1",
        position=1,
        score=1.0,
        success=True,
        library=("send_message",),
    )


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------


def test_message_train_defaults_and_validation():
    assert Message("assistant", "x").train is True
    assert Message("user", "x").train is False
    assert Message("assistant", "x", train=False).train is False
    with pytest.raises(DatasetError, match="only assistant"):
        Message("user", "x", train=True)
    with pytest.raises(DatasetError, match="role"):
        Message("tool", "x")
    with pytest.raises(DatasetError, match="no trained"):
        ChatExample(messages=(Message("user", "x"),), task_id="t")


def test_jsonl_round_trip(tmp_path):
    examples = [example(0), example(1, trailing_obs=True, temperature=None)]
    path = tmp_path / "d.jsonl"
    assert write_jsonl(examples, path) == 2
    assert read_jsonl(path) == examples


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    good = json.dumps(example(0).to_dict())
    bad_role = json.loads(good)
    bad_role["messages"][1]["role"] = "robot"
    path.write_text("\n".join([good, good, "{not json", good]) + "\n")
    with pytest.raises(DatasetError, match=r"d\.jsonl:3:"):
        read_jsonl(path)
    path.write_text(good + "\n" + json.dumps(bad_role) + "\n")
    with pytest.raises(DatasetError, match=r"d\.jsonl:2: .*robot"):
        read_jsonl(path)
    path.write_text(json.dumps({**json.loads(good), "scenario": "x"}) + "\n")
    with pytest.raises(DatasetError, match=r":1: unknown field\(s\) \['scenario'\]"):
        read_jsonl(path)
    with pytest.raises(DatasetError, match="not found"):
        read_jsonl(tmp_path / "missing.jsonl")


def trajectory(codes: list[str | None]) -> Trajectory:
    task = Task("sc7_2", "sc7", 2, "Do it.", "train")
    turns = tuple(
        Turn((1,), (0.0,), text=f"turn {i} {c or 'no code'}", code=c, result=ExecResult(f"obs {i}", True))
        for i, c in enumerate(codes)
    )
    return Trajectory(
        task,
        (1, 2),
        turns,
        Outcome(0.5, False),
        StopReason.COMPLETED,
        library_in=("f", "g"),
        policy="scripted",
    )


def test_example_from_trajectory_flags_no_code_turns_and_keeps_provenance():
    traj = trajectory(["x = 1", None, "done()"])
    msgs = episode_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "Do it."}], traj)
    assert [m["role"] for m in msgs] == ["system", "user"] + ["assistant", "user"] * 3
    assert msgs[4] == {"role": "assistant", "content": "turn 1 no code"} and msgs[5]["content"] == "obs 1"
    ex = example_from_trajectory(traj, msgs, temperature=0.3)
    assert [m.train for m in ex.messages if m.role == "assistant"] == [True, False, True]
    assert (ex.policy, ex.temperature, ex.scenario_id, ex.task_id, ex.position) == (
        "scripted",
        0.3,
        "sc7",
        "sc7_2",
        2,
    )
    assert (ex.score, ex.success, ex.library) == (0.5, False, ("f", "g"))
    assert ex.num_trained_messages == 2
    all_trained = example_from_trajectory(traj, msgs, train_no_code_turns=True)
    assert all_trained.num_trained_messages == 3


def test_example_from_trajectory_rejects_messages_that_do_not_match_the_turns():
    traj = trajectory(["x = 1"])
    head = [{"role": "system", "content": "S"}, {"role": "user", "content": "Do it."}]
    with pytest.raises(DatasetError, match="0 assistant messages for 1 turns"):
        example_from_trajectory(traj, head)
    with pytest.raises(DatasetError, match="not the text of its turn"):
        example_from_trajectory(traj, [*head, {"role": "assistant", "content": "something else"}])
    with pytest.raises(DatasetError, match="must start with system, user"):
        example_from_trajectory(traj, head[1:] + [{"role": "assistant", "content": traj.turns[0].text}])


# --------------------------------------------------------------------------------------------
# Hugging Face parquet
# --------------------------------------------------------------------------------------------


def test_hf_parquet_round_trip_and_load_dataset(tmp_path):
    from datasets import load_dataset

    examples = [example(0), example(1, trailing_obs=True, temperature=None)]
    path = export_hf(examples, tmp_path / "hf")
    assert path.suffix == ".parquet"
    assert read_hf(tmp_path / "hf") == examples
    ds = load_dataset(str(tmp_path / "hf"), split="train", cache_dir=str(tmp_path / "cache"))
    assert ds[1]["messages"][-1] == {"role": "user", "content": "Task completed.", "train": False}
    assert ds[1]["temperature"] is None and ds[0]["library"] == ["send_message"]


# --------------------------------------------------------------------------------------------
# LLaMA-Factory sharegpt
# --------------------------------------------------------------------------------------------


def test_sharegpt_layout_and_dataset_info(tmp_path):
    (tmp_path / "lf").mkdir()
    (tmp_path / "lf" / "dataset_info.json").write_text(json.dumps({"other": {"file_name": "o.json"}}))
    data_file = export_sharegpt([example(0, trailing_obs=True)], tmp_path / "lf", name="sage")
    rows = json.loads(data_file.read_text())
    assert len(rows) == 1
    assert rows[0]["system"] == "You are an agent. Write Python."
    # the trailing observation is cut: a sharegpt conversation must end on a gpt turn
    assert [t["from"] for t in rows[0]["conversations"]] == ["human", "gpt", "human", "gpt"]
    assert rows[0]["conversations"][1]["value"] == example(0).messages[2].content
    assert rows[0]["task_id"] == "sc0_1" and rows[0]["library"] == ["send_message"]
    info = json.loads((tmp_path / "lf" / "dataset_info.json").read_text())
    assert info["other"] == {"file_name": "o.json"}  # other datasets are kept
    assert info["sage"] == {
        "file_name": "sage.json",
        "formatting": "sharegpt",
        "columns": {"messages": "conversations", "system": "system"},
        "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"},
    }


def test_sharegpt_round_trip(tmp_path):
    examples = [example(0), example(1, temperature=None)]
    export_sharegpt(examples, tmp_path)
    assert read_sharegpt(tmp_path) == examples


def test_sharegpt_observation_tag():
    rows = sharegpt_rows(example(0), observation_tag="observation")
    assert [t["from"] for t in rows[0]["conversations"]] == ["human", "gpt", "observation", "gpt"]


def untrained_middle() -> ChatExample:
    msgs = list(example(0).messages)
    msgs[2] = Message("assistant", msgs[2].content, train=False)
    return ChatExample(messages=tuple(msgs), task_id="sc0_1")


def test_sharegpt_untrained_assistant_turn_cannot_be_trained_by_default():
    with pytest.raises(ExportError, match=r"sc0_1: assistant message\(s\) \[1\].*mode='last'"):
        sharegpt_rows(untrained_middle(), mode="all")


def test_sharegpt_last_mode_gives_one_record_per_trained_turn():
    # mode "last" + LLaMA-Factory's mask_history: true trains only each record's final gpt turn
    rows = sharegpt_rows(untrained_middle(), mode="last")
    assert len(rows) == 1 and len(rows[0]["conversations"]) == 4
    rows = sharegpt_rows(example(0), mode="last")
    assert [len(r["conversations"]) for r in rows] == [2, 4]
    assert rows[0]["conversations"][-1]["value"] == example(0).messages[2].content


def test_sharegpt_trailing_untrained_turn_is_cut():
    msgs = [*example(0).messages, Message("user", "obs"), Message("assistant", "no code here", train=False)]
    rows = sharegpt_rows(ChatExample(messages=tuple(msgs)))
    assert [t["value"] for t in rows[0]["conversations"]][-1] == example(0).messages[-1].content


def test_sharegpt_rejects_non_alternating_messages():
    msgs = (Message("system", "s"), Message("user", "a"), Message("user", "b"), Message("assistant", "c"))
    with pytest.raises(ExportError, match="message 1 after the system prompt is 'user'"):
        sharegpt_rows(ChatExample(messages=msgs))


def test_export_all_writes_the_three_formats(tmp_path):
    from sage_rl.data.export import export_all

    examples = [example(0), example(1, trailing_obs=True)]
    paths = export_all(examples, tmp_path, name="exp")
    assert paths["jsonl"] == tmp_path / "exp.jsonl" and read_jsonl(paths["jsonl"]) == examples
    assert read_hf(tmp_path / "hf") == examples
    assert len(read_sharegpt(tmp_path / "llamafactory", "exp")) == 2


def test_no_examples_export_as_empty_datasets(tmp_path):
    """A collection that kept nothing still writes every format (no crash, the schema kept)."""
    from sage_rl.data.export import export_all

    paths = export_all([], tmp_path, name="none")
    assert read_jsonl(paths["jsonl"]) == [] and read_hf(tmp_path / "hf") == []
    assert read_sharegpt(tmp_path / "llamafactory", "none") == []

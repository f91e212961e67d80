"""SFT token masking and batching: only trained assistant tokens carry loss, boundaries match the
chat template, and packing computes exactly what padding computes."""

from __future__ import annotations

import copy

import pytest
import torch

from sage_rl.agent.render import ChatRenderer
from sage_rl.data.records import ChatExample, DatasetError, Message
from sage_rl.train.sft import forward_loss_sum
from sage_rl.train.sft_data import (
    IGNORE,
    Encoded,
    collate,
    encode_example,
    mask_runs,
    pack,
    pack_shared,
    shared_len,
    split_by_scenario,
    token_loss_sum,
)


def conv_example(untrained: tuple[int, ...] = (), trailing_obs: bool = True, i: int = 0) -> ChatExample:
    """system, task, then 3 assistant/observation rounds; assistant k untrained when k in ``untrained``."""
    msgs = [
        Message("system", "You are an agent. Write Python."),
        Message("user", f"Task {i}: count the songs."),
    ]
    codes = [
        "songs = apis.music.songs()\nprint(len(songs))",
        "def total(x):\n    return sum(x)\nprint(total([1, 2]))",
        "apis.supervisor.complete_task()",
    ]
    for k, code in enumerate(codes):
        msgs.append(Message("assistant", f"```python\n{code}\n```", train=k not in untrained))
        if k < 2 or trailing_obs:
            msgs.append(Message("user", f"Output {k}: 3\n"))
    return ChatExample(messages=tuple(msgs), scenario_id=f"s{i}", task_id=f"s{i}_1")


def template_ids(tok, messages, generation_prompt=False) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def renderer(tiny):
    return ChatRenderer(tiny[1])


def test_mask_runs():
    assert mask_runs([0, 1, 1, 0, 1, 0, 0, 1]) == [(1, 3), (4, 5), (7, 8)]
    assert mask_runs([]) == [] and mask_runs([1]) == [(0, 1)]


def test_only_assistant_content_and_end_of_turn_carry_loss(tiny, renderer):
    tok = tiny[1]
    ex = conv_example()
    enc = encode_example(renderer.conversation, ex)
    runs = mask_runs(enc.mask)
    assistants = [m for m in ex.messages if m.role == "assistant"]
    assert len(runs) == 3
    for (a, b), msg in zip(runs, assistants, strict=True):
        assert tok.decode(enc.ids[a:b]) == msg.content + "<|im_end|>"
        assert enc.ids[b - 1] == renderer.eot_id
    trained = [t for t, m in zip(enc.ids, enc.mask, strict=True) if m]
    untrained_text = tok.decode([t for t, m in zip(enc.ids, enc.mask, strict=True) if not m])
    assert len(trained) == sum(b - a for a, b in runs)
    for m in ex.messages:
        if m.role != "assistant":  # the system prompt, the task and every observation carry no loss
            assert m.content in untrained_text


def test_token_boundaries_match_the_chat_template(tiny, renderer):
    tok = tiny[1]
    ex = conv_example(trailing_obs=True)
    msgs = ex.chat()
    enc = encode_example(renderer.conversation, ex)
    # The whole sequence is the template's tokenisation, ending with the generation prompt.
    assert list(enc.ids) == template_ids(tok, msgs, generation_prompt=True)
    # Each trained span starts exactly where the template's generation prompt for that turn ends,
    # and ends exactly where the template's rendering of that turn ends (minus the newline after
    # the end-of-turn token, which the policy does not generate).
    runs = mask_runs(enc.mask)
    starts = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    for (a, b), k in zip(runs, starts, strict=True):
        assert a == len(template_ids(tok, msgs[:k], generation_prompt=True))
        assert b == len(template_ids(tok, msgs[: k + 1])) - 1
        assert tok.decode(template_ids(tok, msgs[: k + 1])[b:]) == "\n"


def test_conversation_ending_on_assistant_is_a_prefix_of_the_template(tiny, renderer):
    tok = tiny[1]
    ex = conv_example(trailing_obs=False)
    enc = encode_example(renderer.conversation, ex)
    full = template_ids(tok, ex.chat())
    assert list(enc.ids) == full[:-1] and tok.decode(full[-1:]) == "\n"
    assert enc.mask[-1] == 1 and enc.ids[-1] == renderer.eot_id


def test_untrained_messages_carry_no_loss(tiny, renderer):
    tok = tiny[1]
    full = encode_example(renderer.conversation, conv_example())
    part = encode_example(renderer.conversation, conv_example(untrained=(1,)))
    assert part.ids == full.ids
    r = mask_runs(full.mask)
    assert mask_runs(part.mask) == [r[0], r[2]]
    assert "def total" not in tok.decode([t for t, m in zip(part.ids, part.mask, strict=True) if m])


def test_renderer_span_count_mismatch_is_an_error():
    ex = conv_example()

    def merged_spans(messages):  # a renderer that masks the observations too: one big run
        return [1, 2, 3], [0, 1, 1]

    with pytest.raises(DatasetError, match="1 trained spans for 3 assistant messages"):
        encode_example(merged_spans, ex)


def test_collate_labels_positions_and_block_mask():
    a, b = Encoded((5, 6, 7), (0, 1, 1)), Encoded((8, 9), (0, 1))
    batch = collate([[a, b], [b]], pad_id=0)
    assert batch.input_ids_BT.tolist() == [[5, 6, 7, 8, 9], [8, 9, 0, 0, 0]]
    assert batch.labels_BT.tolist() == [[IGNORE, 6, 7, IGNORE, 9], [IGNORE, 9, IGNORE, IGNORE, IGNORE]]
    assert batch.position_ids_BT.tolist() == [[0, 1, 2, 0, 1], [0, 1, 0, 0, 0]]
    allowed = (batch.attn_B1TT[:, 0] == 0).int().tolist()
    assert allowed[0] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    assert allowed[1] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
    assert batch.num_trained == 4


def test_token_loss_sum_by_hand():
    # vocab 2, uniform logits: every trained token costs log 2; two trained tokens -> 2 log 2.
    logits = torch.zeros(1, 3, 2)
    labels = torch.tensor([[IGNORE, 1, 0]])
    assert token_loss_sum(logits, labels).item() == pytest.approx(2 * torch.log(torch.tensor(2.0)).item())
    logits[0, 0] = torch.tensor([0.0, 1.0])  # position 0 predicts label 1: -log(e / (1 + e))
    expected = -torch.log_softmax(torch.tensor([0.0, 1.0]), 0)[1] + torch.log(torch.tensor(2.0))
    assert token_loss_sum(logits, labels).item() == pytest.approx(expected.item(), rel=1e-6)


def test_pack_first_fit():
    es = [Encoded((1,) * n, (1,) * n) for n in (5, 4, 3, 2)]
    rows = pack(es, max_length=7)
    assert [[len(e.ids) for e in row] for row in rows] == [[5, 2], [4, 3]]


def test_packed_rows_compute_what_padded_rows_compute(tiny, renderer):
    model = copy.deepcopy(tiny[0])
    encs = [encode_example(renderer.conversation, conv_example(i=i)) for i in range(3)]
    padded = collate([[e] for e in encs], pad_id=0)
    packed = collate([encs], pad_id=0)

    def loss(batch):
        out = model(
            input_ids=batch.input_ids_BT, attention_mask=batch.attn_B1TT, position_ids=batch.position_ids_BT
        )
        return token_loss_sum(out.logits, batch.labels_BT)

    with torch.no_grad():
        assert padded.num_trained == packed.num_trained
        assert loss(packed).item() == pytest.approx(loss(padded).item(), rel=1e-5)
        # and the padded row computes what the example alone computes
        alone = sum(loss(collate([[e]], pad_id=0)).item() for e in encs)
        assert loss(padded).item() == pytest.approx(alone, rel=1e-5)
        # the trainer computes only the logits it needs; the sum is the same
        for batch in (padded, packed):
            assert len(batch.loss_positions_K) < batch.input_ids_BT.shape[1] - 1
            assert forward_loss_sum(model, batch).item() == pytest.approx(loss(batch).item(), rel=1e-5)


def test_split_by_scenario_holds_out_whole_scenarios():
    exs = [
        ChatExample(messages=(Message("assistant", "x"),), scenario_id=f"s{i % 5}", task_id=f"t{i}")
        for i in range(15)
    ]
    train, evals = split_by_scenario(exs, eval_fraction=0.2, seed=0)
    assert len(evals) == 3 and len(train) == 12
    assert not {e.scenario_id for e in train} & {e.scenario_id for e in evals}
    assert split_by_scenario(exs, 0.2, seed=0) == (train, evals)  # deterministic for a seed
    assert split_by_scenario(exs, 0.0, seed=0) == (exs, [])
    # a tiny fraction still holds one scenario out; a huge one keeps one for training
    assert len({e.scenario_id for e in split_by_scenario(exs, 0.01, 0)[1]}) == 1
    assert len({e.scenario_id for e in split_by_scenario(exs, 0.99, 0)[0]}) == 1


def test_collate_shared_head_layout_by_hand():
    # two examples sharing 16 tokens (MIN_SHARED); 3 and 2 more tokens each, trained from index 17
    head = tuple(range(100, 116))
    a = Encoded((*head, 7, 8, 9), (0,) * 17 + (1, 1))
    b = Encoded((*head, 5, 6), (0,) * 17 + (1,))
    assert shared_len([a, b]) == 16 and shared_len([a]) == 0
    batch = collate([[a, b]], pad_id=0, share=True)
    assert batch.input_ids_BT.tolist() == [[*head, 7, 8, 9, 5, 6]]
    assert batch.position_ids_BT.tolist() == [[*range(16), 16, 17, 18, 16, 17]]
    assert batch.labels_BT[0, 16:].tolist() == [IGNORE, 8, 9, IGNORE, 6]
    allowed = (batch.attn_B1TT[0, 0] == 0).int()
    assert allowed[:16, :16].tolist() == torch.tril(torch.ones(16, 16, dtype=torch.int)).tolist()
    assert allowed[:16, 16:].sum() == 0  # the head sees no example
    assert allowed[16:19, :16].all() and allowed[19:, :16].all()  # every example sees the head
    assert allowed[19:, 16:19].sum() == 0 and allowed[16:19, 19:].sum() == 0  # nor each other
    assert batch.num_trained == 3
    # a shared head that is too short is not used: the row is laid out as plain packing
    short = [Encoded((1, 2, 3, 4), (0, 0, 1, 1)), Encoded((1, 2, 3, 5), (0, 0, 0, 1))]
    assert torch.equal(collate([short], 0, share=True).input_ids_BT, collate([short], 0).input_ids_BT)


def test_pack_shared_counts_the_head_once():
    head = tuple(range(100, 130))  # 30 shared tokens
    es = [Encoded((*head, i, i), (0,) * 31 + (1,)) for i in range(5)]
    # plain packing: 32 tokens each, 2 per 70-token row; shared: 30 + 2 x 5 = 40 <= 70
    assert [len(r) for r in pack(es, max_length=70)] == [2, 2, 1]
    assert [len(r) for r in pack_shared(es, max_length=70)] == [5]
    assert [len(r) for r in pack_shared(es, max_length=35)] == [2, 2, 1]  # 30 + 2 + 2 = 34


def long_system_example(i: int) -> ChatExample:
    system = "You are an agent that writes Python against the apps of a phone. " * 4
    ex = conv_example(i=i)
    return ChatExample(
        messages=(Message("system", system), *ex.messages[1:]), scenario_id=f"s{i}", task_id=f"t{i}"
    )


def test_shared_rows_give_the_loss_and_gradients_of_each_example_alone(tiny, renderer):
    encs = [encode_example(renderer.conversation, long_system_example(i)) for i in range(3)]
    assert shared_len(encs) >= 16
    shared = collate([encs], pad_id=0, share=True)
    assert shared.input_ids_BT.shape[1] < sum(len(e.ids) for e in encs)
    results = []
    for batches in ([shared], [collate([[e]], pad_id=0) for e in encs]):
        model = copy.deepcopy(tiny[0])
        loss = sum(forward_loss_sum(model, b) for b in batches)
        loss.backward()
        results.append((loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    (l_shared, g_shared), (l_alone, g_alone) = results
    assert shared.num_trained == sum(e.num_trained for e in encs)
    assert l_shared == pytest.approx(l_alone, rel=1e-5)
    for name, g in g_alone.items():
        assert (g_shared[name] - g).abs().max() <= 1e-5 * g.abs().max(), name

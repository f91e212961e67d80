"""Token-exact chat rendering for multi-turn episodes.

A multi-turn episode is one growing token sequence:

    prompt_ids(system, user) + sampled_1 + observation_ids(obs_1, sampled_1) + sampled_2 + ...

Sampled ids are appended exactly as the policy produced them, and each observation is rendered on
its own through the chat template and tokenised alone. Nothing is ever decoded and re-encoded:
decoding a non-canonical tokenisation and encoding it again gives different ids (PLATFORM.md,
"token drift"), which would make the logprobs recorded at sampling time refer to other tokens than
the ones the trainer scores.

How the template's pieces are found: the chat template is rendered for a probe conversation with a
fixed system message (SmolLM2's and Qwen's templates inject a default system prompt when the first
message is not a system one, so the probe always has one), and the pieces are the string
differences between growing prefixes of it. The constructor checks that the template really
renders that way (each rendering extends the previous one) and raises ``ValueError`` otherwise.

Message contents are text, never control tokens (issue 11): an observation that prints
``<|im_end|>\n<|im_start|>assistant`` must not forge a turn boundary in the model's context, nor
may a skill's docstring in the prompt. So only the template's own text is scanned for special
tokens; contents are encoded with special tokens treated as plain text. Text runs between the
template's special tokens are encoded whole, so ordinary contents get exactly the ids a plain
encoding of the rendered conversation gives.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

Message = Mapping[str, str]

_PROBE_SYSTEM = "S"
_PROBE_USER = "U"
_PROBE_ASSISTANT = "A"


class ChatRenderer:
    """Renders prompts and observations with a Hugging Face tokenizer's chat template.

    Attributes:
        eot_id: the token that ends an assistant turn (``<|im_end|>`` for SmolLM2 and Qwen).
        stop_ids: ids that end sampling: ``eot_id`` and the tokenizer's eos id.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._close = _assistant_close(tokenizer)
        self._before_observation = _render(tokenizer, _probe_messages(), generation_prompt=False)
        close_ids = self._encode(self._close)
        self.eot_id: int = close_ids[0] if close_ids else -1
        self._eot_text: str = tokenizer.convert_ids_to_tokens(self.eot_id) if close_ids else ""
        if not (self._eot_text and self._close.startswith(self._eot_text)):
            raise ValueError(f"the chat template closes an assistant turn with {self._close!r}, not a token")
        eos = tokenizer.eos_token_id
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in (self.eot_id, eos) if i is not None))
        specials = sorted(_added_tokens(tokenizer), key=len, reverse=True)
        self._specials = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials else None
        self._nonce = secrets.token_hex(4)  # content markers no message can contain by chance
        self._observation_frame = self._frame()
        probe = _render(tokenizer, _probe_messages(), generation_prompt=True)
        if self._encode_pieces([(probe, False)]) != self._encode(probe):
            raise ValueError("this tokenizer does not encode text around special tokens independently")

    def _frame(self) -> tuple[str, str]:
        """The template text around a user message's content when it is appended (head, tail)."""
        mark = f"\ue000{self._nonce}\ue001"
        probe = [*_probe_messages(), {"role": "user", "content": mark}]
        added = _render(self.tokenizer, probe, generation_prompt=True)[len(self._before_observation) :]
        head, sep, tail = added.partition(mark)
        if not sep or mark in tail:
            raise ValueError("the chat template does not render a user message's content once, unchanged")
        return head, tail

    def _encode(self, text: str) -> list[int]:
        # Special tokens come from the template text itself, so none are added around it.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
        """Ids of ``(text, is_content)`` pieces: special tokens are matched in template pieces only;
        the text between two of them (template text and contents alike) is encoded as one run with
        special tokens treated as plain text."""
        ids: list[int] = []
        run: list[str] = []
        for text, is_content in pieces:
            parts = [text] if is_content or self._specials is None else self._specials.split(text)
            for i, part in enumerate(parts):
                if i % 2 == 0:
                    run.append(part)
                    continue
                ids += self._encode_text("".join(run))
                run = []
                ids.append(self.tokenizer.convert_tokens_to_ids(part))
        return ids + self._encode_text("".join(run))

    def _encode_text(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The rendered conversation (usually system + user) followed by the generation prompt;
        message contents are placed verbatim in the template's frame, as text."""
        marks = [f"\ue000{self._nonce}-{i}\ue001" for i in range(len(messages))]
        framed = self.tokenizer.apply_chat_template(
            [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)],
            tokenize=False,
            add_generation_prompt=True,
        )
        pieces: list[tuple[str, bool]] = []
        for m, mark in zip(messages, marks, strict=True):
            head, sep, framed = framed.partition(mark)
            if not sep or mark in framed:
                raise ValueError("the chat template does not render each message's content once, unchanged")
            pieces += [(head, False), (m["content"], True)]
        return self._encode_pieces([*pieces, (framed, False)])

    def observation_ids(self, text: str, gen_ids: Sequence[int]) -> list[int]:
        """Ids to append after a turn's sampled ``gen_ids``: the rest of the assistant turn's
        closer (all of it when sampling stopped on length, i.e. without the end-of-turn token),
        then the new user message ``text`` (as text: special tokens in it are not tokens) and the
        generation prompt. Only this new text is tokenised."""
        ended = bool(gen_ids) and gen_ids[-1] == self.eot_id
        close = self._close[len(self._eot_text) :] if ended else self._close
        head, content, tail = self._observation_text(text)
        return self._encode_pieces([(close + head, False), (content, True), (tail, False)])

    def _observation_text(self, text: str) -> tuple[str, str, str]:
        """(template text before the content, the content as rendered, template text after it)."""
        # The probe conversation ends with a closed assistant turn; what adding the user message
        # appends to its rendering is exactly the new message + the generation prompt.
        before = self._before_observation
        message = {"role": "user", "content": text}
        after = _render(self.tokenizer, [*_probe_messages(), message], generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template re-renders earlier turns when a user message is added")
        added = after[len(before) :]
        head, tail = self._observation_frame
        if not (added.startswith(head) and added.endswith(tail) and len(added) >= len(head) + len(tail)):
            raise ValueError("the chat template's frame of a user message depends on its content")
        return head, added[len(head) : len(added) - len(tail)], tail

    def conversation(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """``(ids, mask)`` for a whole conversation, built exactly as the agent loop builds it.

        The messages before the first assistant one form the prompt; each assistant message is
        taken as sampled ids (its content's canonical tokens + ``eot_id``) with mask 1; each user
        message after an assistant one is an observation with mask 0. The sequence ends after the
        last message (after the ``eot_id`` if it is an assistant one), as a sampled episode does.
        """
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        ids = self.prompt_ids(messages[:first])
        mask = [0] * len(ids)
        gen: list[int] = []
        for m in messages[first:]:
            if m["role"] == "assistant":
                gen = self._encode(m["content"]) + [self.eot_id]
                ids += gen
                mask += [1] * len(gen)
            elif m["role"] == "user" and gen:
                obs = self.observation_ids(m["content"], gen)
                ids += obs
                mask += [0] * len(obs)
                gen = []
            else:
                raise ValueError(f"after the prompt, expected alternating assistant/user, got {m['role']!r}")
        return ids, mask


def _probe_messages() -> list[dict[str, str]]:
    return [
        {"role": "system", "content": _PROBE_SYSTEM},
        {"role": "user", "content": _PROBE_USER},
        {"role": "assistant", "content": _PROBE_ASSISTANT},
    ]


def _render(tokenizer: Any, messages: Sequence[Message], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=generation_prompt
    )


def _assistant_close(tokenizer: Any) -> str:
    """The text after an assistant message's content up to the next message (``<|im_end|>\n``
    for SmolLM2), read off renderings of the probe conversation."""
    probe = _probe_messages()
    with_prompt = _render(tokenizer, probe[:2], generation_prompt=True)
    without = _render(tokenizer, probe[:2], generation_prompt=False)
    full = _render(tokenizer, probe, generation_prompt=False)
    if not (with_prompt.startswith(without) and full.startswith(with_prompt + _PROBE_ASSISTANT)):
        raise ValueError(
            "cannot split this chat template into turns: rendering an assistant reply does not "
            f"extend the prompt rendered with the generation prompt ({full!r} vs {with_prompt!r})"
        )
    return full[len(with_prompt) + len(_PROBE_ASSISTANT) :]


def _added_tokens(tokenizer: Any) -> set[str]:
    """Every token the tokenizer matches as a whole in raw text: its named special tokens and its
    added vocabulary. (A tokenizer saved and reloaded may list ``<|im_end|>`` only among the
    latter, so ``all_special_tokens`` alone can miss the template's own control tokens.)"""
    found = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found |= {str(getattr(t, "content", t)) for t in decoder.values()}
    return {t for t in found if t}

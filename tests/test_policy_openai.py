"""OpenAIPolicy against a real HTTP server on 127.0.0.1: parsing, retries, timeouts, clear errors."""

from __future__ import annotations

import asyncio
import socket

import pytest
from fakes import FakeServer, chat_reply

from sage_rl.policies.base import Policy, PolicyRequest, SamplingParams
from sage_rl.policies.openai_policy import OpenAIPolicy, OpenAIPolicyError

MESSAGES = ({"role": "user", "content": "Add 2 and 3."},)
PARAMS = SamplingParams(temperature=0.5, max_tokens=7, seed=3)


@pytest.fixture
def serve():
    servers = []

    def start(script):
        servers.append(FakeServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _policy(server, **options) -> OpenAIPolicy:
    defaults = {"max_retries": 2, "backoff_s": 0.01, "timeout_s": 5.0}
    return OpenAIPolicy(server.url, "smol", **{**defaults, **options})


def _generate(policy, request=None):
    return asyncio.run(policy.generate(request or PolicyRequest(MESSAGES, None, PARAMS)))


def test_chat_sends_the_request_and_reads_ids_and_logprobs(serve):
    lps = [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1.0}, {"token": "c", "logprob": -0.25}]
    server = serve(lambda path, body, h: (200, chat_reply(token_ids=[7, 8, 2], logprobs=lps), {}, 0))
    policy = _policy(server, api_key="sk-test")
    assert isinstance(policy, Policy) and policy.tokenizer is None
    out = _generate(policy)
    assert (out.text, out.token_ids, out.logprobs) == ("print(5)", (7, 8, 2), (-0.5, -1.0, -0.25))
    assert (out.finish_reason, out.prompt_tokens, out.completion_tokens) == ("stop", 11, 3)
    method, path, body, headers = server.requests[0]
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert headers["Authorization"] == "Bearer sk-test"
    assert body["messages"] == list(MESSAGES) and body["model"] == "smol"
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.5, 7, 3)
    assert body["logprobs"] is True and body["return_token_ids"] is True


def test_ids_spelled_as_token_id_strings_are_parsed(serve):
    lps = [{"token": "token_id:40", "logprob": -0.1}, {"token": "token_id:2", "logprob": -0.2}]
    server = serve(lambda path, body, h: (200, chat_reply(logprobs=lps, finish="length"), {}, 0))
    out = _generate(_policy(server))
    assert (out.token_ids, out.logprobs, out.finish_reason) == ((40, 2), (-0.1, -0.2), "length")


def test_a_server_refusing_the_extras_gets_plain_requests_from_then_on(serve):
    def script(path, body, headers):
        if "return_token_ids" in body:
            return (
                400,
                {"error": {"message": "Unrecognized request argument supplied: return_token_ids"}},
                {},
                0,
            )
        return 200, chat_reply(text="hi", usage={"prompt_tokens": 4, "completion_tokens": 1}), {}, 0

    server = serve(script)
    policy = _policy(server)
    first, second = _generate(policy), _generate(policy)
    assert first == second
    assert (first.text, first.token_ids, first.logprobs, first.completion_tokens) == ("hi", (), (), 1)
    assert len(server.posts()) == 3  # refused once, then plain twice
    assert "logprobs" not in server.posts()[2]


def test_other_400s_are_raised_with_the_servers_message(serve):
    server = serve(lambda path, body, h: (400, {"error": {"message": "prompt is too long"}}, {}, 0))
    with pytest.raises(OpenAIPolicyError, match="prompt is too long") as e:
        _generate(_policy(server))
    assert e.value.status == 400 and len(server.posts()) == 1


def test_retries_429_and_5xx_then_succeeds(serve):
    answers = iter([(429, {"error": "slow down"}, {"Retry-After": "0"}, 0), (503, {}, {}, 0)])
    server = serve(lambda path, body, h: next(answers, (200, chat_reply(), {}, 0)))
    assert _generate(_policy(server)).text == "print(5)"
    assert len(server.posts()) == 3


def test_gives_up_after_max_retries_naming_the_status(serve):
    server = serve(lambda path, body, h: (502, {"error": {"message": "bad gateway"}}, {}, 0))
    with pytest.raises(OpenAIPolicyError, match=r"502.*bad gateway.*3 attempts") as e:
        _generate(_policy(server, max_retries=2))
    assert e.value.status == 502 and len(server.posts()) == 3


def test_a_slow_server_times_out_and_is_retried(serve):
    answers = iter([(200, chat_reply(text="late"), {}, 1.0)])
    server = serve(lambda path, body, h: next(answers, (200, chat_reply(text="on time"), {}, 0)))
    assert _generate(_policy(server, timeout_s=0.2)).text == "on time"
    server_always_slow = serve(lambda path, body, h: (200, chat_reply(), {}, 1.0))
    with pytest.raises(OpenAIPolicyError, match=r"timed out after 0\.2 s.*2 attempts"):
        _generate(_policy(server_always_slow, timeout_s=0.2, max_retries=1))


def test_bad_key_is_a_clear_error_and_not_retried(serve):
    server = serve(lambda path, body, h: (401, {"error": {"message": "Incorrect API key"}}, {}, 0))
    with pytest.raises(OpenAIPolicyError, match="API key was rejected.*Incorrect API key") as e:
        _generate(_policy(server, api_key="wrong"))
    assert e.value.status == 401 and len(server.posts()) == 1


def test_unknown_model_names_the_model_and_what_is_served(serve):
    def script(path, body, headers):
        if path == "/v1/models":
            return 200, {"data": [{"id": "qwen"}, {"id": "smollm2"}]}, {}, 0
        return 404, {"error": {"message": "The model `smol` does not exist."}}, {}, 0

    with pytest.raises(OpenAIPolicyError, match=r"model 'smol' is not served.*\['qwen', 'smollm2'\]"):
        _generate(_policy(serve(script)))


def test_wrong_path_says_so(serve):
    server = serve(lambda path, body, h: (404, {"detail": "Not Found"}, {}, 0))
    with pytest.raises(OpenAIPolicyError, match="no such endpoint"):
        _generate(OpenAIPolicy(server.url.removesuffix("/v1"), "smol", max_retries=0))


def test_connection_refused_is_a_clear_error():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "smol", max_retries=1, backoff_s=0.01)
    with pytest.raises(
        OpenAIPolicyError, match=r"cannot connect to http://127\.0\.0\.1:\d+/v1/chat/completions"
    ):
        _generate(policy)


def test_concurrency_is_limited(serve):
    server = serve(lambda path, body, h: (200, chat_reply(), {}, 0.05))
    policy = _policy(server, max_concurrency=3)

    async def many():
        return await asyncio.gather(
            *[policy.generate(PolicyRequest(MESSAGES, None, PARAMS)) for _ in range(10)]
        )

    outs = asyncio.run(many())
    assert len(outs) == 10 and len(server.posts()) == 10
    assert 1 <= server.max_in_flight <= 3


def test_completions_mode_sends_token_ids(serve, tiny):
    tok = tiny[1]
    reply = {
        "choices": [
            {
                "text": "x",
                "token_ids": [88, 2],
                "logprobs": {"tokens": ["x", "<|im_end|>"], "token_logprobs": [-0.3, -0.1]},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    server = serve(lambda path, body, h: (200, reply, {}, 0))
    policy = _policy(server, mode="completions", tokenizer=tok)
    assert policy.tokenizer is tok
    out = _generate(policy, PolicyRequest(MESSAGES, (1, 2, 3), PARAMS))
    assert (out.token_ids, out.logprobs) == ((88, 2), (-0.3, -0.1))
    path, body = server.requests[0][1], server.requests[0][2]
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3]
    assert body["stop_token_ids"] == [tok.convert_tokens_to_ids("<|im_end|>")]
    with pytest.raises(ValueError, match="tokenizer"):
        OpenAIPolicy(server.url, "smol", mode="completions")

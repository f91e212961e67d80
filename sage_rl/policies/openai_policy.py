"""Any OpenAI-compatible server (vLLM, SGLang, litellm, OpenAI) as a ``Policy``, over httpx.

Two modes:

- ``chat`` (default): ``POST {base_url}/chat/completions`` with the request's ``messages``. Works
  with any server. ``policy.renderer`` is None, so the agent loop keeps text only.
- ``completions``: ``POST {base_url}/completions`` with ``prompt`` = the request's token ids, for
  token-exact rollouts against vLLM. Needs the served model's tokenizer (the agent loop renders
  prompts and observations with it, as with the local transformers policy).

Token ids and logprobs are read where the server returns them: vLLM's ``return_token_ids``
(``choice.token_ids``), or logprob tokens spelled ``token_id:N`` (vLLM's
``return_tokens_as_token_ids``); logprobs from the standard ``logprobs`` fields. A server that
rejects these optional fields with a 400 is asked again without them, once, and from then on
this policy sends plain requests: text and usage counts only. (Only a 400 whose message names
one of those fields counts as a refusal; other 400s, e.g. a too-long prompt, are raised.)

Text: the reply's text is taken as the server sent it, except a lone surrogate (``"\\ud800"``, which
a JSON body can spell but which is no character: UTF-8, tokenizers and the next request cannot
carry it), replaced by U+FFFD (``text.valid_text``). Token ids, where returned, are kept exact.

Failures: 429, 5xx, timeouts and refused connections are retried with exponential backoff
(``Retry-After`` is honoured); then, and for 401/403/404/other 4xx at once, an
``OpenAIPolicyError`` is raised whose message says what was wrong (URL, key or model).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import httpx

from sage_rl.policies.base import Completion, PolicyRequest, SamplingParams
from sage_rl.text import valid_text

_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_MAX_RETRY_AFTER_S = 30.0


class OpenAIPolicyError(RuntimeError):
    """A request to the server failed for good. ``status`` is the HTTP status (None: no response)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Retryable(Exception):
    def __init__(self, message: str, status: int | None = None, after_s: float | None = None) -> None:
        super().__init__(message)
        self.status, self.after_s = status, after_s


class OpenAIPolicy:
    """``Policy`` over an OpenAI-compatible HTTP API (see the module docstring).

    ``params`` are the defaults of :meth:`complete`; :meth:`generate` follows ``request.params``.
    At most ``max_concurrency`` requests are in flight; each attempt has ``timeout_s``; a failed
    attempt is retried ``max_retries`` times, waiting ``backoff_s * 2**attempt`` (capped).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        params: SamplingParams = SamplingParams(),
        max_concurrency: int = 16,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        mode: Literal["chat", "completions"] = "chat",
        tokenizer: Any | None = None,
        name: str | None = None,
    ) -> None:
        if mode == "completions" and tokenizer is None:
            raise ValueError("mode='completions' sends token ids: pass the served model's tokenizer")
        if mode not in ("chat", "completions"):
            raise ValueError(f"mode must be 'chat' or 'completions', got {mode!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.base_url, self.model, self.mode = base_url.rstrip("/"), model, mode
        self.params, self.max_concurrency, self.timeout_s = params, max_concurrency, timeout_s
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.tokenizer = tokenizer if mode == "completions" else None
        self.renderer = _renderer(tokenizer) if mode == "completions" else None
        self._stop_ids = self.renderer.stop_ids if self.renderer is not None else ()
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.name = name or f"openai:{model}"
        self.extras = True  # send logprobs / token-id options until the server refuses them
        self._session: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient, asyncio.Semaphore] | None = None

    # ---------------------------------------------------------------- public
    def weights_changed(self) -> None:
        """Nothing to do: the server owns its weights (``Policy``)."""

    async def generate(self, request: PolicyRequest) -> Completion:
        """One turn: a chat completion of ``request.messages`` (or, in completions mode, a
        completion of ``request.prompt_ids``)."""
        if self.mode == "completions" and request.prompt_ids is None:
            raise ValueError("completions mode needs request.prompt_ids")
        path = "/chat/completions" if self.mode == "chat" else "/completions"
        client, limit = self._client()
        async with limit:
            body = self._body(request, self.extras)
            try:
                data = await self._post(client, path, body)
            except OpenAIPolicyError as e:
                if not (
                    self.extras and e.status == 400 and any(k in str(e) for k in self._extras(request.params))
                ):
                    raise
                self.extras = False  # the server refused an optional field: go plain from now on
                data = await self._post(client, path, self._body(request, extras=False))
        return self._parse(data)

    async def complete(
        self, messages: Sequence[Mapping[str, str]], params: SamplingParams | None = None
    ) -> Completion:
        """``generate`` for a message list with this policy's default ``params``."""
        return await self.generate(PolicyRequest(tuple(messages), None, params or self.params))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session[1].aclose()
            self._session = None

    # ---------------------------------------------------------------- requests
    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        # A client and a semaphore belong to one event loop; a new loop (a new asyncio.run) gets
        # new ones.
        loop = asyncio.get_running_loop()
        if self._session is None or self._session[0] is not loop:
            timeout = httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0))
            limits = httpx.Limits(max_connections=self.max_concurrency)
            client = httpx.AsyncClient(timeout=timeout, limits=limits, headers=self._headers)
            self._session = (loop, client, asyncio.Semaphore(self.max_concurrency))
        return self._session[1], self._session[2]

    def _body(self, request: PolicyRequest, extras: bool) -> dict[str, Any]:
        p = request.params
        body: dict[str, Any] = {"model": self.model, "max_tokens": p.max_tokens, "temperature": p.temperature}
        if p.top_p < 1.0:
            body["top_p"] = p.top_p
        if p.seed is not None:
            body["seed"] = p.seed
        if self.mode == "chat":
            body["messages"] = [dict(m) for m in request.messages]
        else:
            body["prompt"] = list(request.prompt_ids or ())
        if extras:
            body.update(self._extras(p))
        return body

    def _extras(self, p: SamplingParams) -> dict[str, Any]:
        """Optional fields: logprobs (OpenAI) and vLLM's token-id options and top_k."""
        extra: dict[str, Any] = {"return_token_ids": True}
        extra["logprobs"] = True if self.mode == "chat" else 1
        if self.mode == "chat":
            extra["return_tokens_as_token_ids"] = True
        else:
            extra["stop_token_ids"] = list(self._stop_ids)
            extra["skip_special_tokens"] = False
        if p.top_k > 0:
            extra["top_k"] = p.top_k
        return extra

    async def _post(self, client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        for attempt in range(self.max_retries + 1):
            try:
                return await self._attempt(client, url, body)
            except _Retryable as e:
                if attempt == self.max_retries:
                    raise OpenAIPolicyError(f"{e} (gave up after {attempt + 1} attempts)", e.status) from None
                delay = e.after_s if e.after_s is not None else self.backoff_s * 2**attempt
                await asyncio.sleep(min(delay, self.max_backoff_s))
        raise AssertionError("unreachable")

    async def _attempt(self, client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await client.post(url, json=body)
        except httpx.TimeoutException:
            raise _Retryable(f"POST {url} timed out after {self.timeout_s} s") from None
        except httpx.ConnectError as e:
            raise _Retryable(
                f"cannot connect to {url} ({e}): is the server running at this base_url?"
            ) from None
        except httpx.TransportError as e:
            raise _Retryable(f"POST {url} failed: {type(e).__name__}: {e}") from None
        if response.status_code in _RETRY_STATUS:
            raise _Retryable(
                f"POST {url} returned {response.status_code}: {_detail(response)}",
                response.status_code,
                _retry_after(response),
            )
        if response.status_code >= 400:
            raise OpenAIPolicyError(await self._explain(client, url, response), response.status_code)
        try:
            return response.json()
        except ValueError:
            raise OpenAIPolicyError(f"POST {url} returned non-JSON: {response.text[:200]!r}") from None

    async def _explain(self, client: httpx.AsyncClient, url: str, response: httpx.Response) -> str:
        status, detail = response.status_code, _detail(response)
        if status in (401, 403):
            return f"POST {url} returned {status}: the API key was rejected (or none was given): {detail}"
        if status == 404:
            models = await self._served_models(client)
            if models is not None and self.model not in models:
                return f"model {self.model!r} is not served at {self.base_url}; it serves {models}: {detail}"
            if models is None:
                return f"POST {url} returned 404: no such endpoint (does base_url end in /v1?): {detail}"
            return f"POST {url} returned 404 for model {self.model!r}: {detail}"
        return f"POST {url} returned {status}: {detail}"

    async def _served_models(self, client: httpx.AsyncClient) -> list[str] | None:
        """Ids from ``GET {base_url}/models``, or None where that fails too."""
        try:
            response = await client.get(self.base_url + "/models")
            return [m["id"] for m in response.json()["data"]] if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    # ---------------------------------------------------------------- responses
    def _parse(self, data: Mapping[str, Any]) -> Completion:
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.mode == "chat" else choice["text"]
        except (KeyError, IndexError, TypeError):
            raise OpenAIPolicyError(
                f"unexpected response shape from {self.base_url}: {str(data)[:300]}"
            ) from None
        if text is not None and not isinstance(text, str):
            raise OpenAIPolicyError(
                f"unexpected response from {self.base_url}: the completion's text is a {type(text).__name__}"
            )
        ids, logprobs = _tokens(choice, self.mode)
        usage = data.get("usage") or {}
        return Completion(
            text=valid_text(text or ""),  # a lone surrogate is no character: U+FFFD (module docstring)
            token_ids=ids,
            logprobs=logprobs if len(logprobs) == len(ids) else (),
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or len(ids)),
        )


def _tokens(choice: Mapping[str, Any], mode: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Sampled ids and logprobs from one choice; empty where the server did not return them."""
    lp = choice.get("logprobs") or {}
    if mode == "chat":
        entries = lp.get("content") or []
        logprobs = tuple(float(e["logprob"]) for e in entries)
        spelled = [e.get("token", "") for e in entries]
    else:
        logprobs = tuple(float(x) for x in lp.get("token_logprobs") or [])
        spelled = list(lp.get("tokens") or [])
    if choice.get("token_ids") is not None:
        return tuple(int(i) for i in choice["token_ids"]), logprobs
    if spelled and all(isinstance(t, str) and t.startswith("token_id:") for t in spelled):
        return tuple(int(t.removeprefix("token_id:")) for t in spelled), logprobs
    return (), ()  # logprobs without ids cannot be tied to tokens we could train on


def _renderer(tokenizer: Any) -> Any:
    from sage_rl.agent.render import ChatRenderer

    return ChatRenderer(tokenizer)


def _detail(response: httpx.Response) -> str:
    """The server's error message (OpenAI's ``{"error": {"message": ...}}`` or the raw text)."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
        return str(message or response.text)[:300]
    except (ValueError, AttributeError):
        return response.text[:300]


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return min(float(response.headers["retry-after"]), _MAX_RETRY_AFTER_S)
    except (KeyError, ValueError):
        return None

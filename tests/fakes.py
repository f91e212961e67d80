"""Fakes shared by the tests: an environment for the agent-loop tests (no model, no world) and an
OpenAI-compatible HTTP server on 127.0.0.1 (for the OpenAI policy and the commands that use it)."""

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sage_rl.types import CallRecord, CheckResult, ExecResult, Outcome, skill_origin


class FakeEnv:
    """Executes nothing; records cells. A cell containing 'complete' completes the task; a cell
    containing 'boom' fails; a skill preamble named 'bad' fails to define. A library skill 'f' or
    'g' named in a cell is reported called once, returned, after a successful API call, with an
    effect in the world (``CallRecord.effects``)."""

    reports_calls = True

    def __init__(self):
        self.cells, self._done, self.task = [], False, None

    async def reset(self, task):
        self.cells, self._done, self.task = [], False, task

    async def execute(self, code, origin):
        self.cells.append((origin, code))
        if origin.startswith("<skill:"):
            return ExecResult("", ok="bad" not in origin)
        calls = tuple(CallRecord(n, skill_origin(n), 1, 0, 1, 1) for n in ("f", "g") if f"{n}(" in code)
        self._done = self._done or "complete" in code
        return ExecResult(
            "Error" if "boom" in code else "out", ok="boom" not in code, calls=calls, defined=()
        )

    async def evaluate(self):
        return Outcome.from_checks((CheckResult("done", self._done),))

    @property
    def completed(self):
        return self._done

    async def close(self):
        pass


# (status, json body, extra headers, seconds to wait before answering)
Reply = tuple[int, dict, dict, float]


def chat_reply(text="print(5)", token_ids=None, logprobs=None, finish="stop", usage=None) -> dict:
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    return {"choices": [choice], "usage": usage or {"prompt_tokens": 11, "completion_tokens": 3}}


class FakeServer:
    """A threaded HTTP server whose answers come from ``script(path, body, headers) -> Reply``."""

    def __init__(self, script: Callable[[str, dict, dict], Reply]) -> None:
        self.script, self.requests, self.in_flight, self.max_in_flight = script, [], 0, 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: dict) -> None:
                with server.lock:
                    server.requests.append((self.command, self.path, body, dict(self.headers)))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, payload, headers, delay = server.script(self.path, body, dict(self.headers))
                    time.sleep(delay)
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    for k, v in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def do_POST(self):  # noqa: N802
                self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

            def do_GET(self):  # noqa: N802
                self._answer({})

            def log_message(self, *args):
                pass

        return Handler

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def posts(self) -> list[dict]:
        return [body for method, _, body, _ in self.requests if method == "POST"]

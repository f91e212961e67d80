"""Fakes shared by the agent-loop tests (no model, no world)."""

from sage_rl.types import CallRecord, CheckResult, ExecResult, Outcome, skill_origin


class FakeEnv:
    """Executes nothing; records cells. A cell containing 'complete' completes the task; a cell
    containing 'boom' fails; a skill preamble named 'bad' fails to define."""

    reports_calls = True

    def __init__(self):
        self.cells, self._done, self.task = [], False, None

    async def reset(self, task):
        self.cells, self._done, self.task = [], False, task

    async def execute(self, code, origin):
        self.cells.append((origin, code))
        if origin.startswith("<skill:"):
            return ExecResult("", ok="bad" not in origin)
        calls = tuple(CallRecord(n, skill_origin(n), 1, 0) for n in ("f", "g") if f"{n}(" in code)
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

"""A stand-in for the Ray Serve `DeploymentHandle` that `app/ray_backend.HandleBackend` calls: each
`generate_remote` call answers with a scripted stream (`StandInResponse`), and every call is recorded."""

from __future__ import annotations

import asyncio


class StandInResponse:
    """A DeploymentResponseGenerator: async-iterable, and `cancel()`able."""

    def __init__(self, items, fail: BaseException | None = None, cancel_fails: BaseException | None = None,
                 hold: asyncio.Event | None = None):
        self.items, self.fail, self.cancel_fails, self.hold = list(items), fail, cancel_fails, hold
        self.cancelled = 0
        self.yielded = 0

    def __aiter__(self):
        return self._items()

    async def _items(self):
        for item in self.items:
            self.yielded += 1
            yield item
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail

    def cancel(self) -> None:
        self.cancelled += 1
        if self.cancel_fails is not None:
            raise self.cancel_fails


class _Method:
    def __init__(self, handle: StandInHandle, name: str):
        self.handle, self.name = handle, name

    def remote(self, *args):
        self.handle.calls.append((self.name, args))
        if self.name == "generate_remote":
            if self.handle.responses:  # one per call, in order (retries); else the same answer every time
                self.handle.response = self.handle.responses.pop(0)
            return self.handle.response
        outcome = self.handle.answers[self.name]

        async def answer():
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        return answer()


class StandInHandle:
    """The parts of a DeploymentHandle that HandleBackend uses: `options(stream=True)` and `.<method>.remote()`."""

    def __init__(self, response: StandInResponse | None = None, responses: list[StandInResponse] | None = None,
                 **answers):
        self.response, self.responses, self.answers = response, list(responses or []), answers
        self.calls: list[tuple[str, tuple]] = []
        self.options_seen: list[dict] = []

    def options(self, **options):
        self.options_seen.append(options)
        return self

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

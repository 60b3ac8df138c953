"""GrammarGate: a structured output's grammar compiled first in a process of its own, within a deadline, so that one
the engine would take minutes over never reaches it.

vLLM compiles each request's grammar in its EngineCore (xgrammar) on a thread nothing can stop, and only a regex
has a time limit there (which frees the caller, not the thread). A 15 KB EBNF grammar, within this service's size
bounds, compiled for minutes at 100 % of a core after its request had timed out, and the next constrained request
waited behind it until the replica declared its engine wedged and restarted it (2-core Xeon, 2026-12-07: 3,000
optional literals; the compile time grows as the 2.2th power of their number, 13 s at 400). Here the grammar the
engine would compile is compiled first by grammar_worker.py (in a child it forks for each); past
`limits.max_grammar_compile_s` that child is killed with its compile and the request is refused with a 400. Each
verdict is kept, so a grammar seen before costs nothing; one that compiles is compiled again by the engine
(milliseconds for the schemas of tools and response formats). One the compiler refuses is refused with its words
(the engine would end the request with nothing to say but "error"). New compiles wait their turn, shared among
tenants.

    gate = GrammarGate(folder, vocab_size, trust_remote_code, deadline_s, pin)   # in the engine's start
    refusal = await gate.check(structured, sender)   # None (the engine's backend pinned), or why it is refused
    gate.close()                                     # in the engine's shutdown
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from pathlib import Path

from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.structured_output.backend_guidance import has_guidance_unsupported_json_features
from vllm.v1.structured_output.backend_types import StructuredOutputOptions
from vllm.v1.structured_output.backend_xgrammar import has_xgrammar_unsupported_json_features
from vllm.v1.structured_output.request import get_structured_output_key
from vllm.v1.structured_output.utils import choice_as_grammar, grammar_is_likely_lark

from app.engine.vllm.grammar_backend import XgrammarPin

log = logging.getLogger(__name__)
MARGIN_S = 10.0  # beyond the deadline, for the worker to kill its compile and answer
START_S = 120.0  # the worker's imports and tokenizer: about 5 s on an idle 2-core machine
VERDICTS_KEPT = 1024
SENDERS_KEPT = 4096  # senders whose last turn is remembered
XGRAMMAR_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
OUTLINES_ONLY = ("the JSON schema has patternProperties together with a keyword xgrammar lacks (multipleOf; "
                 "uniqueItems, contains, minContains or maxContains; a string format it lacks; pattern or format with "
                 "minLength or maxLength; propertyNames or several patternProperties, or either with properties; allOf "
                 "with several branches): vLLM would check it with its outlines backend, in the serving process and "
                 "without a time limit. Remove the patternProperties, or that keyword")


class Unenforceable(Exception):
    """A constraint this service does not let reach vLLM."""


def compiled_as(structured: StructuredOutputsParams) -> tuple[str, str] | None:
    """What vLLM's xgrammar backend compiles for this constraint, as (kind, spec): vLLM's own key for it (the spec
    the engine compiles), a choice list as the grammar vLLM's checks rewrite it into, a grammar as EBNF or Lark as
    the backend tells them apart. None where it compiles nothing worth a check (`json_object`'s fixed grammar).
    A schema with keywords xgrammar lacks (vLLM's own lists) is checked by guidance in vLLM's front end (quickly) and
    compiled by xgrammar in the engine (grammar_backend.py), which ignores them, as `vllm serve`'s does once it runs
    xgrammar. One that guidance lacks too (patternProperties) would be checked by outlines, whose check parsed the
    regex of 3,000 properties with Python's `re` in the replica's process for minutes (2-core Xeon), until Serve's
    health check killed the replica: `Unenforceable`."""
    option, spec = get_structured_output_key(structured)
    if option is StructuredOutputOptions.JSON:
        schema = json.loads(spec)
        if isinstance(schema, dict) and has_xgrammar_unsupported_json_features(schema) \
                and has_guidance_unsupported_json_features(schema):
            raise Unenforceable(OUTLINES_ONLY)
        return "json", spec
    if option is StructuredOutputOptions.REGEX:
        return "regex", spec
    if option is StructuredOutputOptions.CHOICE:
        return "ebnf", choice_as_grammar(json.loads(spec))
    if option is StructuredOutputOptions.GRAMMAR:
        return ("lark" if grammar_is_likely_lark(spec) else "ebnf"), spec
    return None


class _Turns:
    """One compile at a time; when the worker is free, the next turn goes to the sender whose last turn is the
    oldest, whatever each has queued: one client sending new constraints by the dozen (each up to the deadline)
    waits behind its own, and another's waits for one at most (8 at once from one client held a new schema of
    another's for 74 s in first-come order, 2-core Xeon)."""

    def __init__(self) -> None:
        self.busy = False
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self._last: OrderedDict[str, float] = OrderedDict()  # each sender's last turn, the oldest first

    @contextlib.asynccontextmanager
    async def turn(self, sender: str) -> AsyncIterator[None]:
        if self.busy:
            granted = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(sender, deque()).append(granted)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():  # handed the turn as it was cancelled: pass it on
                    self._next()
                else:
                    self._waiting[sender].remove(granted)
                    if not self._waiting[sender]:
                        del self._waiting[sender]
                raise
        self.busy = True
        self._last[sender] = time.monotonic()
        self._last.move_to_end(sender)
        while len(self._last) > SENDERS_KEPT:
            self._last.popitem(last=False)
        try:
            yield
        finally:
            self._next()

    def _next(self) -> None:
        self.busy = bool(self._waiting)  # held for the one woken, so that no newcomer takes the turn before it
        if self._waiting:
            sender = min(self._waiting, key=lambda s: self._last.get(s, float("-inf")))
            queue = self._waiting[sender]
            granted = queue.popleft()
            if not queue:
                del self._waiting[sender]
            granted.set_result(None)


class GrammarGate:
    def __init__(self, folder: str, vocab_size: int, trust_remote_code: bool, deadline_s: float,
                 pin: XgrammarPin | None = None):
        self._pin = pin
        self._command = [sys.executable, "-m", "app.engine.vllm.grammar_worker", folder, str(vocab_size),
                         "1" if trust_remote_code else "0", str(deadline_s)]
        self._deadline_s = deadline_s
        self._worker: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._broken = False  # its worker could not start: constraints go to the engine unchecked
        self._turns = _Turns()
        self._verdicts: OrderedDict[str, str | None] = OrderedDict()  # None: compiled within the deadline
        self._pending: dict[str, asyncio.Future[str | None]] = {}
        self._start()

    def _start(self) -> None:
        if self._broken:
            return
        # Where the replica was deployed from a working directory, the child finds this package the same way.
        root = str(Path(__file__).resolve().parents[3])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self._ready = False
        try:
            self._worker = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        except OSError as err:  # a protection, not a condition of serving
            log.warning("grammar gate could not start (%s); constraints go to the engine unchecked", err)
            self._worker, self._broken = None, True

    async def check(self, structured: StructuredOutputsParams | None, sender: str = "") -> str | None:
        """None when the engine may compile this constraint (its backend then made xgrammar, if the gate has the
        engine's pin); otherwise why it is refused. `sender`: who asks (its tenant), for its turn at the worker."""
        why = await self._why(structured, sender)
        if why is None and structured is not None and self._pin is not None:
            await self._pin.ensure()
        return why

    async def _why(self, structured: StructuredOutputsParams | None, sender: str) -> str | None:
        try:
            what = compiled_as(structured) if structured is not None and not self._broken else None
        except Unenforceable as err:
            return str(err)
        except (ValueError, TypeError, KeyError, AttributeError):  # vLLM's own checks refuse it, with their words
            what = None
        if what is None:
            return None
        key = hashlib.sha256(f"{what[0]}\0{what[1]}".encode("utf-8", "surrogatepass")).hexdigest()
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            return self._verdicts[key]
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._verdict(key, sender, *what))
        # A request cancelled while its constraint compiles leaves the compile to finish: the worker answers each
        # question in turn, and its answer to this one must not be read as the next one's.
        return await asyncio.shield(pending)

    async def _verdict(self, key: str, sender: str, kind: str, spec: str) -> str | None:
        try:
            async with self._turns.turn(sender):  # one compile at a time: the worker holds one core at most
                verdict, kept = await self._compile(kind, spec)
                if kept:
                    self._verdicts[key] = verdict
                    while len(self._verdicts) > VERDICTS_KEPT:
                        self._verdicts.popitem(last=False)
                return verdict
        finally:
            del self._pending[key]

    async def _compile(self, kind: str, spec: str) -> tuple[str | None, bool]:
        """(why it is refused or None, whether that verdict is the constraint's own to keep)."""
        if self._worker is None or self._worker.poll() is not None:
            self._start()
        worker = self._worker
        if worker is None or worker.stdin is None or worker.stdout is None:
            return None, False
        try:
            if not self._ready:
                hello = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), START_S)
                if not json.loads(hello or b"{}").get("ready"):
                    raise OSError(f"the worker ended at its start (exit status {worker.wait()})")
                self._ready = True
            worker.stdin.write((json.dumps({"kind": kind, "spec": spec}) + "\n").encode())
            worker.stdin.flush()
            # The worker kills its compile at the deadline itself; past that and a margin, the worker is stuck.
            line = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), self._deadline_s + MARGIN_S)
        except TimeoutError:
            self._kill()
            if not self._ready:  # the gate itself could not start: leave the constraints to the engine
                log.warning("grammar gate did not start within %.0f s; constraints go to the engine unchecked",
                            START_S)
                self._broken = True
                return None, False
            self._start()  # at once, not at the next constraint: its start takes seconds
            return self._late(), True
        except (OSError, ValueError) as err:  # the gate failed, not the constraint: the engine decides
            log.warning("grammar gate failed (%s); constraints go to the engine unchecked", err)
            self._broken = self._broken or not self._ready
            self._kill()
            return None, False
        answer = json.loads(line or b'{"died": true}')
        if answer.get("ok"):
            return None, True
        if answer.get("late"):
            return self._late(), True
        if answer.get("died"):  # its compile ended the process compiling it (its memory, say): the engine's would too
            if not line:
                self._kill()
                self._start()
            return "the constraint could not be compiled: its compile ended the process checking it; simplify it", False
        # The engine's compile would fail the same way, after admission and with nothing to say but "error".
        error = XGRAMMAR_LOG_PREFIX.sub("", str(answer.get("error"))).strip()  # its clock and source line
        return f"the constraint could not be compiled (xgrammar: {error}): correct or simplify it", True

    def _late(self) -> str:
        return (f"the constraint did not compile within {self._deadline_s:g} s (the engine compiles it into an "
                "automaton for every request): simplify it, for example with fewer optional or repeated parts")

    def _kill(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.kill()
            worker.wait()
            for pipe in (worker.stdin, worker.stdout):
                if pipe is not None:
                    pipe.close()

    def close(self) -> None:
        self._broken = True  # for good: a compile still in flight must not start another worker
        self._kill()

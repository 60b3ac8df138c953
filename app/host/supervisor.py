"""EngineSupervisor: one replica's engine through its life, in one explicit state.

    LOADING -> SERVING -> (DRAINING) -> STOPPED
                  |  the engine died (`EngineDead`) or wedged (`ProgressWatch`)
                  v
          RESTARTING (with an engine factory, within the restart limit) -> SERVING on a new engine
                  or
          BROKEN (no factory, the limit reached, a failed start or restart): the health check fails and Ray Serve
                  replaces the replica

An engine that stops serving is found two ways: it says so (`EngineDead`, from a request or its health check), or
it stops making progress while requests are in it (vLLM's own health check passes an `EngineCore` stopped with
SIGSTOP for ever). Either way requests in flight on it end at once (their deadlines, registered here, expire) with
a retryable 503, and new ones get 503 + Retry-After.

Restart in place, and why it is preferred to Serve's replacement even with several replicas: it skips Serve's
detection delay and a new replica process, and only this process can SIGKILL a stopped EngineCore (a replica that
Serve kills leaves its stopped child behind). While it progresses the health check passes; it fails when the
restart fails, runs past its deadline, or the engine broke too often (a crash loop that a new process may cure:
app/host/restart_budget.py). Figures: docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import time
from collections.abc import Callable

from app.config.model import ModelConfig
from app.engine.interface import Engine, EngineDead, EngineFailed
from app.engine.processes import EngineProcesses, start_engine, stop_engine
from app.errors import EngineWedged, ServiceUnavailable
from app.host.progress_watch import ProgressWatch, Stall
from app.host.restart_budget import RESTART_LIMIT, RESTART_WINDOW_S, RestartBudget

log = logging.getLogger("app.server")
# How long the old engine's shutdown may take before the restart goes on without it (its processes are
# SIGKILLed either way).
SHUTDOWN_TIMEOUT_S = 30.0


class EngineState(enum.Enum):
    LOADING = "loading"  # the engine starts; requests get 503 "starting"
    SERVING = "serving"
    DRAINING = "draining"  # requests in flight finish; the admission refuses new ones; no restart
    RESTARTING = "restarting"  # broken, and a new engine is being started in this process
    BROKEN = "broken"  # cannot serve and is not restarted here: the health check fails
    STOPPED = "stopped"


class EngineSupervisor:
    """Owns the engine, the processes it started and its progress watch. `on_engine` adopts each engine that
    has started (the first and every restarted one) and returns the token budget then in force, for the log."""

    def __init__(self, model: ModelConfig, engine: Engine, on_engine: Callable[[Engine], int],
                 engine_factory: Callable[[], Engine] | None = None, watch: ProgressWatch | None = None,
                 prefill_rate: Callable[[], float | None] = lambda: None):
        self.model = model
        self.engine = engine
        self.watch = watch or ProgressWatch()
        self.state = EngineState.LOADING
        self.reason: str | None = None  # why the current engine cannot serve (died, wedged); None while it can
        self.failure: str | None = None  # a start or restart that failed: the replica is to be replaced
        self.wedged_total = 0
        self.restarts_total = 0
        self.last_stall: Stall | None = None  # the latest wedge, as it was seen
        self._on_engine = on_engine
        self._factory = engine_factory
        self._prefill_rate = prefill_rate
        self._processes = EngineProcesses()
        self.restarts = RestartBudget()
        # The cores this process may use before any engine narrowed them (cpu/affinity.keep_off_engine_cores):
        # a new engine in this process must plan its cores from these, not from the front end's share.
        self._affinity = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        self._clocks: dict[str, asyncio.Timeout] = {}  # each request's deadline around its current engine await
        self._watching: asyncio.Task[None] | None = None
        self._restart: asyncio.Task[None] | None = None

    @property
    def serving(self) -> bool:
        return self.state is EngineState.SERVING

    @property
    def healthy(self) -> bool:
        return self.reason is None and self.failure is None

    @property
    def ready(self) -> bool:
        """An engine is loaded, serving or not (broken without a restart): what /stats calls ready."""
        return self.state in (EngineState.SERVING, EngineState.DRAINING) or (
            self.state is EngineState.BROKEN and self.failure is None)

    def start(self) -> None:
        """Starts the first engine (blocking: on a thread of its own for a start in the background)."""
        started = time.monotonic()
        try:
            self._processes = EngineProcesses.started_by(self.engine.start)
        except Exception as err:
            self.failure = f"the engine for '{self.model.id}' failed to start: {err!r}"
            log.exception("engine for %s failed to start", self.model.id)
            self.engine.shutdown()  # whatever it had started goes with it
            if self.state is EngineState.LOADING:
                self.state = EngineState.BROKEN
            return
        self.restarts.started(time.monotonic() - started)
        budget = self._on_engine(self.engine)
        if self.state is EngineState.LOADING:
            self.state = EngineState.SERVING
        log.info("model %s ready in %.1f s; token budget %d", self.model.id, self.restarts.start_s, budget)

    def require_serving(self) -> None:
        """Raises the 503 that says why no request can start now (draining is the admission's to refuse)."""
        name, state = self.model.id, self.state
        if state is EngineState.RESTARTING:
            raise ServiceUnavailable(f"the engine for '{name}' is restarting ({self.reason}); retry shortly",
                                     retry_after_s=self.restarts.retry_after_s())
        if self.reason:
            raise ServiceUnavailable(f"the engine for '{name}' has {self.reason} and is being replaced; retry shortly",
                                     retry_after_s=5)
        if self.failure:
            raise ServiceUnavailable(f"{self.failure}; the replica is being replaced", retry_after_s=10)
        if state is EngineState.LOADING:
            raise ServiceUnavailable(f"the engine for '{name}' is starting; retry shortly", retry_after_s=5)

    def drain(self) -> None:
        if self.state is EngineState.SERVING:
            self.state = EngineState.DRAINING

    # -- requests on the engine -------------------------------------------

    def serving_engine(self) -> Engine | None:
        """The engine now serving, if one is: a request sent to it asks `left` afterwards whether it broke."""
        return self.engine if self.state is EngineState.SERVING and self.reason is None else None

    def left(self, engine: Engine) -> bool:
        """The request's engine broke, or has been replaced since it started: it must not wait on it."""
        return engine is not self.engine or self.reason is not None

    def ended_by_broken_engine(self, request_id: str = "") -> ServiceUnavailable:
        waited = self.last_stall is not None and request_id in self.last_stall.waiting_ids
        kind = EngineWedged if waited and (self.reason or "").startswith("wedged") else ServiceUnavailable
        return kind(
            f"the engine for '{self.model.id}' stopped serving while this request was in it "
            f"({self.reason or 'replaced'}); retry",
            retry_after_s=self.restarts.retry_after_s() if self.state is EngineState.RESTARTING else 5,
        )

    def engine_error(self, engine: Engine, request_id: str, err: EngineFailed | EngineDead) -> ServiceUnavailable:
        """A retryable 503 for a request the engine ended unfinished (EngineFailed), or died under (EngineDead: the
        engine is marked broken, which restarts or replaces it)."""
        if isinstance(err, EngineFailed):
            log.warning("engine for %s ended request %s unfinished: %s", self.model.id, request_id, err)
            return ServiceUnavailable(f"the engine ended this request without finishing it ({err}); retry",
                                      retry_after_s=1)
        self.engine_broken(engine, f"died ({err})")
        return ServiceUnavailable(
            f"the engine for '{self.model.id}' failed while serving this request; retry shortly", retry_after_s=5
        )

    def clock_started(self, request_id: str, clock: asyncio.Timeout) -> None:
        """A request's deadline around its current engine await, so that a broken engine can end it at once."""
        self._clocks[request_id] = clock

    def clock_ended(self, request_id: str) -> None:
        self._clocks.pop(request_id, None)

    def watch_progress(self) -> None:
        """Looks at the engine's progress every tick while requests are in it (the task ends when none is)."""
        if self._watching is None or self._watching.done():
            self._watching = asyncio.get_running_loop().create_task(self._watch_while_in_flight())

    async def _watch_while_in_flight(self) -> None:
        while self.watch.in_flight and self.state is not EngineState.STOPPED:
            await asyncio.sleep(self.watch.tick_s())
            self.look_for_stall()

    def look_for_stall(self) -> Stall | None:
        if self.state not in (EngineState.SERVING, EngineState.DRAINING) or self.reason:
            return None
        engine = self.engine
        stats = engine.stats()
        stall = self.watch.stalled(
            (stats.prompt_tokens_total + stats.generation_tokens_total, stats.kv_cache_usage), stats.running > 0,
            self._prefill_rate()
        )
        if stall is not None:
            self.last_stall = stall
            self.wedged_total += 1
            log.error("engine for %s wedged: %s; ending requests %s", self.model.id, stall.describe(),
                      ", ".join(stall.request_ids),
                      extra={"model": self.model.id, "request_ids": list(stall.request_ids), "quiet_s": stall.quiet_s})
            self.engine_broken(engine, f"wedged ({stall.describe()})", wedged=True)
        return stall

    # -- the broken engine and its restart --------------------------------

    def engine_broken(self, engine: Engine, why: str, wedged: bool = False) -> None:
        """`engine` cannot serve any more: requests in flight on it end now (their deadlines expire, and the
        request path turns that into a retryable 503), and with a factory an in-place restart begins."""
        if engine is not self.engine or self.reason is not None:
            return
        self.reason = why
        if not wedged:
            log.error("engine for %s %s", self.model.id, why)
        self.restarts.broke()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            for clock in list(self._clocks.values()):
                with contextlib.suppress(RuntimeError):  # that request is at its yield; it checks before its next await
                    clock.reschedule(loop.time())
        if loop is not None and self._may_restart():
            self.state = EngineState.RESTARTING
            self.restarts.restarting()
            self._restart = loop.create_task(self._restart_engine(engine, wedged))
        elif self.state is not EngineState.STOPPED:
            self.state = EngineState.BROKEN

    def _may_restart(self) -> bool:
        if self._factory is None or self.state in (EngineState.STOPPED, EngineState.DRAINING):
            return False
        window_full = self.restarts.exhausted()
        if window_full:
            log.error(
                "engine for %s broke %d times within %.0f s: no restart in place; the replica is to be replaced",
                self.model.id,
                RESTART_LIMIT,
                RESTART_WINDOW_S,
            )
        return not window_full

    async def _restart_engine(self, old: Engine, wedged: bool) -> None:
        started = time.monotonic()
        log.warning("engine for %s: restarting in place (%s)", self.model.id, self.reason)
        try:
            await stop_engine(old, self._processes, wedged, self.model.id, SHUTDOWN_TIMEOUT_S)
            assert self._factory is not None
            engine = self._factory()
            processes, start_s = await asyncio.to_thread(start_engine, engine, self._affinity)
        except Exception as err:
            self.failure = f"the restart of the engine for '{self.model.id}' failed: {err!r}"
            log.exception("engine for %s: restart in place failed; the replica is to be replaced", self.model.id)
            if self.state is EngineState.RESTARTING:
                self.state = EngineState.BROKEN
            return
        if self.state is EngineState.STOPPED:  # the replica stopped meanwhile: the new engine goes with it
            engine.shutdown()
            processes.kill()
            return
        self.engine, self._processes = engine, processes
        self.restarts.started(start_s)
        self.watch = self.watch.renewed()
        self._on_engine(engine)
        self.restarts_total += 1
        self.reason = None
        self.state = EngineState.SERVING
        log.warning("engine for %s: restarted in place in %.1f s", self.model.id, time.monotonic() - started)

    # -- health and the end -----------------------------------------------

    async def check_health(self) -> None:
        """Ray Serve's liveness probe: cheap, never fails because the engine is busy, still loading, or
        restarting in place within its deadline; fails for an engine that died, wedged or could not start
        and is not being restarted here, so Serve replaces the replica."""
        if self.failure:
            raise RuntimeError(f"engine unusable: {self.failure}")
        if self.state is EngineState.RESTARTING:
            overdue = self.restarts.overdue_s()
            if overdue is not None:
                raise RuntimeError(f"the engine's restart in place is not done after {overdue:.0f} s")
            return
        if self.reason:
            raise RuntimeError(f"engine unusable: {self.reason}")
        if self.state is EngineState.LOADING:
            return
        if self.look_for_stall() is None:
            try:
                await self.engine.check_health()
            except EngineDead as err:
                self.engine_broken(self.engine, f"died ({err})")
        if self.reason and self.state is not EngineState.RESTARTING:
            raise RuntimeError(f"engine unusable: {self.reason}")

    def shutdown(self) -> None:
        """Stops the engine and every process it started; an in-place restart under way shuts its new engine
        down when its start returns."""
        broken = self.reason is not None
        self.state = EngineState.STOPPED
        if broken:
            self._processes.kill()  # broken (a stopped EngineCore would sit out vLLM's SIGTERM grace): no grace
        self.engine.shutdown()
        self._processes.kill()

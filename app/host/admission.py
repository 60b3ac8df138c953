"""Per-replica admission: a bounded queue in front of the engine, fair between tenants, bounded in time as well.

At most `max_running` requests, holding at most `token_budget` tokens (prompt + n * max_tokens) between them, are in
the engine at once; up to `max_queued` more wait, in the fair order between tenants (app/host/fair_queue.py: one
tenant is first come, first served); anything beyond is refused at once. The budget keeps a burst of long requests
waiting here instead of making the engine preempt and recompute; a request bigger than the whole budget still runs,
alone, so nothing valid is refused for ever. A running request may step out of the engine and back (host/pauses.py).

In time: with a `pace` (app/host/pace.py), a request predicted to miss its first-token (or end) target is refused at
arrival (app/host/time_refusals.py: 429, Retry-After the predicted excess; none when it would miss even alone), before
it is tokenized where even the least request would (`refuse_if_full` with targets), and later if another tenant's
arrival, going first, makes it late; the queue timeout stays as a safety net. The simulation ignores the token budget.

Use: `ticket = admission.reserve(tenant)` (cheap; raises before any work), validate,
`await ticket.admit(tokens, timeout_s, targets, prompt_tokens, max_steps)`, run, report each output
with `ticket.produced(steps)` (this is how the pace is learned), and `ticket.release(completed)` in a `finally`
(`completed`: the engine ended it, not a hang-up, a timeout or an error). Pausing: app/host/pauses.py.
"""

from __future__ import annotations

import time

from app.errors import QueueFull, QueueTimeout, RequestTimeout, ServiceUnavailable, TenantOverShare
from app.host.demand import DemandMeter
from app.host.fair_queue import FairQueue
from app.host.pace import EnginePace, Prediction, Work
from app.host.slots import Slots
from app.host.stats import AdmissionStats
from app.host.ticket import ASIDE, EVICTED, RELEASED, RESERVED, RUNNING, WAITING, Ticket
from app.host.time_refusals import NO_TARGETS, Targets, never_in_time, over_time
from app.tenancy import ANONYMOUS, Tenant

# How often the queue is checked again against the pace (on a first token, while requests wait): each check
# simulates the whole queue once (~1 ms for 64 queued behind 32 running).
SWEEP_EVERY_S = 1.0


class Admission:
    def __init__(self, max_running: int, max_queued: int, token_budget: int, queue_timeout_s: float,
                 refusal: type[QueueFull] = QueueFull, pace: EnginePace | None = None, by_class: bool = False):
        self.pace, self.max_running, self.max_queued = pace, max_running, max_queued
        self.token_budget, self.queue_timeout_s, self._refusal = token_budget, queue_timeout_s, refusal
        self._in_system = 0  # reserved, waiting or running: what `max_running + max_queued` bounds
        self._aside = 0  # out of the engine while their clients do not read (host/pauses.py)
        self._waiting: FairQueue[Ticket] = FairQueue()  # fair between tenants (host/fair_queue.py)
        self._slots: Slots[Ticket] = Slots(self._waiting.served, by_class)  # who is in the engine (host/slots.py)
        self._refused_full = self._refused_timeout = self._refused_time = self._peak_waiting = 0
        self._last_prediction: Prediction | None = None
        self._mean_run_s, self._swept_at = 1.0, 0.0  # a moving average of time in the engine, for Retry-After
        self._closed_reason: str | None = None
        self.demand = DemandMeter()  # for the autoscaling policy (host/replica_load.scaling_figures)

    def retry_after_s(self, arriving: int = 0) -> float:
        """When a place frees up: the predicted start of the first queued request (the soonest end of those running);
        unmeasured, or while a burst still tokenizing (or `arriving`) takes the free slots unseen, mean run x rounds."""
        free, unseen = self.max_running - self._slots.seqs, self._in_system - len(self._slots) - len(self._waiting)
        burst = 0 < free <= unseen + arriving  # they will take the free slots: the predictor would see them free
        first_free = None if burst else self._newcomer(behind_queue=False)
        if first_free is not None:
            return min(60.0, max(1.0, first_free.start_s))
        rounds = max((len(self._waiting) + 1) / self.max_running, 1.0 if burst else 0.0)
        return min(60.0, max(1.0, self._mean_run_s * rounds))

    def predicted_wait_s(self) -> float | None:
        """The first token of a newcomer with nothing to prefill, queued now (None: pace not measured); each prompt
        token adds `pace.prefill_s_per_token()` (what the fleet router predicts with, app/routing/)."""
        prediction = self._newcomer(behind_queue=True)
        return None if prediction is None else prediction.first_token_s

    def _newcomer(self, behind_queue: bool) -> Prediction | None:
        if self.pace is None:
            return None
        now = time.monotonic()
        return self.pace.predict(Work(prompt_tokens=0, max_tokens=1), (t.work(now) for t in self._slots.held),
                                 (t.work(now) for t in self._waiting) if behind_queue else (), self.max_running)

    def reserve(self, tenant: Tenant = ANONYMOUS) -> Ticket:
        victim = self._victim_or_refusal(tenant)
        if victim is not None:
            self._evict(victim)
        self._in_system += 1
        self._waiting.entered(tenant)
        return Ticket(self, tenant)

    def refuse_if_full(self, tenant: Tenant = ANONYMOUS, targets: Targets = NO_TARGETS, max_steps: int = 1) -> None:
        """Raises the refusal `reserve` would, without reserving anything or displacing anyone: for work done before
        a slot is taken (rendering, tokenizing), so that a full replica still refuses before that work; with
        `targets`, also the refusal by time that the least a request can be (one prompt token, one output) gets."""
        self._victim_or_refusal(tenant)
        self._judge(Work(prompt_tokens=1, max_tokens=1), tenant, targets, max_steps, time.monotonic())

    def _victim_or_refusal(self, tenant: Tenant) -> Ticket | None:
        """Nothing while there is room; full, the waiting request of a more served tenant that gives its place to
        `tenant` (host/fair_queue.py), or else the refusal raised."""
        if self._closed_reason:
            raise ServiceUnavailable(self._closed_reason, retry_after_s=5)
        if self._in_system < self.max_running + self.max_queued:
            return None
        victim = self._waiting.over_share(tenant)
        if victim is None:
            self._refused_full += 1
            self._waiting.refused(tenant)
            raise self._refusal(f"Server is at capacity ({self.max_running} running, {self.max_queued} queued); "
                                "retry after the Retry-After delay, with backoff", retry_after_s=self.retry_after_s())
        return victim

    def _evict(self, ticket: Ticket) -> None:
        """`ticket` out of the queue and the system now (its release later gives back nothing more), refused."""
        self._waiting.remove(ticket, refused=True)
        self._waiting.left(ticket.tenant)
        ticket.state = EVICTED
        self._in_system -= 1
        self._refused_full += 1
        ticket.wake(TenantOverShare(
            f"Tenant '{ticket.tenant.name}' is over its share of this replica while others wait; retry after the "
            "Retry-After delay", retry_after_s=self.retry_after_s()))

    def _fits(self, ticket: Ticket) -> bool:
        return self._slots.room_for(ticket, self.max_running, self.token_budget)

    def _start(self, ticket: Ticket) -> None:
        ticket.state = RUNNING
        ticket.started = time.monotonic()
        self._slots.take(ticket)
        ticket.resuming, ticket.paused = ticket.paused, False
        self._waiting.started(ticket.tenant, 0 if ticket.resuming else ticket.prompt_tokens)
        ticket.batch = self._slots.seqs  # engine sequences, as the pace's batch is counted
        ticket.backlog = self._slots.prefill_before(ticket)

    def _refuse_late(self, ticket: Ticket, targets: Targets) -> None:
        """`OverTimeTarget` if the pace predicts `ticket` would miss a target, or would wait in the queue
        longer than `queue_timeout_s` only to be refused there; records the prediction."""
        now = time.monotonic()
        prediction = self._judge(ticket.work(now), ticket.tenant, targets, ticket.max_steps, now)
        if prediction is not None:
            ticket.predicted_first_s, ticket.asked_at = prediction.model_first_token_s, now

    def _judge(self, work: Work, tenant: Tenant, targets: Targets, max_steps: int, now: float) -> Prediction | None:
        """The prediction for `work` of `tenant` arriving now, or the refusal by time raised. With no target at all
        (`ttft_target_s: null` and none asked for) admission is by count alone, as configured."""
        if self.pace is None or (targets.first_token_s is None and targets.finish_s is None):
            return None
        running = (t.work(now, self._slots.prefills_after(t, tenant))
                   for t in self._slots.for_newcomer(tenant, self._waiting.counter(tenant)))
        ahead = (t.work(now) for t in self._waiting.ahead_of(tenant))  # fair: only who goes first
        prediction = self.pace.predict(work, running, ahead, self.max_running)
        if prediction is None:
            return None
        self._last_prediction = prediction
        if not self._slots and not self._waiting:
            # An idle engine is the best case there is: nothing to wait behind. Refusing here would only be the
            # model's error, and a model that refuses everything learns nothing more (it learns from admitted
            # requests; docs/sizing.md, "Admission by time").
            return prediction
        late = over_time(prediction, targets, 0.0, self.queue_timeout_s)
        if late is not None:
            self._refused_time += 1
            never = never_in_time(self.pace.predict(work, (), (), self.max_running), targets)
            if never is None:  # demand another replica could meet (the autoscaling policy's)
                self.demand.refused(max_steps * self.pace.output_share if targets.counts_demand else 0.0, now)
                self._waiting.refused(tenant)
            raise never or late
        return prediction

    def _produced(self, ticket: Ticket, steps: int) -> None:
        now = time.monotonic()
        if self.pace is not None and ticket.state == RUNNING and not ticket.resuming:  # a resume's wait is no pace
            was_ready, first = self.pace.ready, not ticket.last_output
            if first:
                self.pace.first_token(ticket.backlog, ticket.batch, now - ticket.started)
                if ticket.predicted_first_s:
                    self.pace.observed(ticket.predicted_first_s, now - ticket.asked_at)
            else:
                self.pace.decoded(self._slots.seqs, steps, now - ticket.last_output, self.max_running,
                                  self._slots.prefilling(ticket.last_output, now))
            if self._waiting and not was_ready and self.pace.ready:
                self._sweep(now, judged=False)
            elif self._waiting and first and now - self._swept_at >= SWEEP_EVERY_S:
                self._sweep(now, judged=True)
        ticket.steps += steps
        self.demand.served(steps, now)
        self._slots.produced(ticket, now)
        self._waiting.charge(ticket.tenant, generated=steps * ticket.choices)
        self._ask_to_yield()  # served more now, a tenant may owe the waiting head a slot

    def _sweep(self, now: float, judged: bool) -> None:
        """Refuses queued requests now predicted to miss what they wait for, their wait so far counted. Not `judged`
        (the pace has just been measured; queued by count alone): any target, or the queue timeout. `judged` (each
        predicted in time at arrival; at most once a second): the queue timeout only (docs/sizing.md has why)."""
        self._swept_at = now
        self._refuse_waiting(queue := list(self._waiting), set(queue), now, targets=not judged)
        self._pump()

    def _refuse_overtaken(self, newcomer: Ticket) -> None:
        """The fair order put `newcomer` ahead of other tenants' waiting requests, each predicted in time when it
        came: those it now makes late are refused at once (their tenants were served more), not left to miss."""
        order = list(self._waiting) if self.pace is not None and self.pace.ready else []  # per arrival: skip the sort
        overtaken = {t for t in order[order.index(newcomer) + 1:] if t.tenant != newcomer.tenant} if order else set()
        if overtaken:
            self._refuse_waiting(order, overtaken, time.monotonic(), targets=True)

    def _refuse_waiting(self, queue: list[Ticket], check: set[Ticket], now: float, targets: bool) -> None:
        """Refuses those of `check` that `queue` (waiting, in order), simulated, predicts late for their targets
        (`targets`; else the queue timeout); never a paused one (mid-answer) nor one a running request gives way to."""
        assert self.pace is not None
        check = {t for t in check if not t.paused} - self._slots.given_way(check)
        predictions = self.pace.predict_queue((t.work(now) for t in self._slots.held), [t.work(now) for t in queue],
                                              self.max_running)
        for ticket, prediction in zip(queue, predictions, strict=False):
            late = over_time(prediction, ticket.targets if targets else Targets(), now - ticket.queued_at,
                             self.queue_timeout_s) if ticket in check else None
            if late is not None:
                self._waiting.remove(ticket, refused=True)
                ticket.state = RESERVED  # out of the queue; its release only gives back its place in the system
                self._refused_time += 1
                steps = ticket.max_steps if ticket.targets.counts_demand else 0  # 0: its sender counts it
                self.demand.refused(steps * self.pace.output_share, now)
                ticket.wake(late)

    async def _admit(self, ticket: Ticket, tokens: int, timeout_s: float, targets: Targets, prompt_tokens: int,
                     max_steps: int) -> None:
        assert ticket.state == RESERVED, ticket.state
        ticket.tokens, ticket.prompt_tokens, ticket.max_steps = tokens, prompt_tokens, max_steps
        self._refuse_late(ticket, targets)
        self._waiting.arrived(ticket.tenant)
        if not self._waiting and self._fits(ticket):
            self._start(ticket)
            return
        ticket.state, ticket.targets, ticket.queued_at = WAITING, targets, time.monotonic()
        self._waiting.append(ticket)
        self._peak_waiting = max(self._peak_waiting, len(self._waiting))
        self._refuse_overtaken(ticket)
        self._ask_to_yield()
        if not await ticket.wait(min(timeout_s, self.queue_timeout_s)):
            self._refused_timeout += 1
            raise QueueTimeout(f"Request waited {min(timeout_s, self.queue_timeout_s):.0f} s in the queue without a "
                               "free slot; retry later", retry_after_s=self.retry_after_s())

    def _release(self, ticket: Ticket, completed: bool = False) -> None:
        if ticket.state in (RELEASED, EVICTED):
            ticket.state = RELEASED
            return
        if ticket.state == RUNNING:
            self._slots.give_back(ticket)
            self._mean_run_s = 0.9 * self._mean_run_s + 0.1 * (time.monotonic() - ticket.started)
            if self.pace is not None and ticket.last_output and completed:
                self.pace.finished(ticket.steps, ticket.max_steps, ticket.prompt_tokens)
        elif ticket.state == WAITING:
            self._waiting.remove(ticket)
        self._aside -= ticket.state == ASIDE  # an aside one's place was given back when it stepped aside
        self._in_system -= ticket.state != ASIDE
        ticket.state = RELEASED
        self._waiting.left(ticket.tenant)
        self._pump()

    def _pump(self) -> None:
        while (head := self._waiting.head()) is not None and self._fits(head):
            ticket = self._waiting.pop_head()
            self._start(ticket)
            ticket.wake()
        self._ask_to_yield()

    def _ask_to_yield(self) -> None:
        """The waiting head cannot start: one running request at a time is asked to give it its slot."""
        head = self._waiting.head()
        if head is not None and not self._fits(head):
            self._slots.ask_to_yield(head.tenant, self._waiting.counter(head.tenant))

    def _step_aside(self, ticket: Ticket) -> None:
        """Out of the engine and out of the count of places; its tenant's share still charged (host/pauses.py)."""
        if ticket.state == RUNNING:
            self._slots.give_back(ticket)
            ticket.state, ticket.yield_asked = ASIDE, False
            self._in_system, self._aside = self._in_system - 1, self._aside + 1
            self._pump()

    async def _pause(self, ticket: Ticket, timeout_s: float) -> None:
        if ticket.state == RUNNING:
            self._slots.give_back(ticket)
        else:  # back from aside: counted again, over the bound if need be (its client is mid-answer)
            self._in_system, self._aside = self._in_system + 1, self._aside - 1
        ticket.state, ticket.paused, ticket.yield_asked = WAITING, True, False
        self._waiting.push_front(ticket)
        self._pump()
        if not await ticket.wait(timeout_s):
            raise RequestTimeout("The request ran past its time limit while paused for another tenant's request or "
                                 "its client; ask for fewer tokens or retry later")

    def close(self, reason: str) -> None:
        """Refuse new requests from now on (draining); those already in keep their places."""
        self._closed_reason = reason

    def stats(self) -> AdmissionStats:
        return AdmissionStats(
            running=len(self._slots), sequences=self._slots.seqs, waiting=len(self._waiting), in_system=self._in_system,
            aside=self._aside, tokens_in_use=self._slots.tokens_in_use, token_budget=self.token_budget,
            peak_waiting=self._peak_waiting, refused_queue_full=self._refused_full,
            refused_queue_timeout=self._refused_timeout, refused_over_time_target=self._refused_time,
            predicted_first_token_s=round(self._last_prediction.first_token_s, 3) if self._last_prediction else None)

"""FleetRouter: each request to the replica that will give its first token soonest, prefix cache and load in one unit.

For every replica that serves, the predicted first token of a request is

    wait_s  +  pending  +  prefill_s_per_token x (prompt tokens not in that replica's prefix cache)

`wait_s` and `prefill_s_per_token` are the replica's own (host/replica_load.py: its admission's queue simulated with
the pace it measured), published about once a second; "pending" is what this router sent the replica since that
figure was taken and that has not answered yet: each its uncached prefill plus `per_request_s` (what one more request
in the batch adds to a first token), so that a burst decided within one second does not pile onto one replica. The
cached tokens are this router's estimate of the replica's prefix cache (a `BlockLRU` of the block names of the
prompts it sent there, sized to the replica's KV cache). The replica with the earliest prediction gets the request;
near-ties go to the one holding more of the prompt, and between equals are offered to Serve together (ordered by a
hash of the prefix and the replica, so identical replicas do not herd and several ingress replicas agree where a new
prefix goes). A warm replica wins by the prefill it saves and loses once its queue costs more than that (and the
near-tie slack): affinity with load balance, no weights.

Corrected by what each engine reports: the first answer carries vLLM's cached tokens. A predicted block that did not
hit is forgotten with every block the estimate used less recently (an LRU cache evicts those first), and the
estimate's size shrinks to what is left (the replica evicts sooner than modelled); confirmed hits let it grow back.

When even the soonest replica misses the request's first-token target, the request is refused here
(`OverTimeTarget`, Retry-After the predicted excess) without trying every replica in turn. An idle replica, or one
whose pace is not measured yet, is never the reason for a refusal: the replica itself then decides.

Use: `decision = router.choose(loads, prompt_ids, target_s, avoid)`, send to `decision.ranked[0]` (or the next ones),
then `router.answered(decision, replica, cached_tokens, first_token_s)` on its first output, or
`router.ended(decision)` if none came. Not thread-safe: called from the ingress's event loop only.
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import count

import numpy as np

from app.engine.prefix_blocks import BlockLRU, block_hashes, cacheable_blocks
from app.errors import OverTimeTarget
from app.host.replica_load import ReplicaLoad
from app.routing.decision import Candidate, Decision, rank
from app.routing.figures import FleetFigures, ReplicaRouting

# Until some replica has measured its pace: 1,000 prompt tokens/s, and 50 ms more per request in the replica. A
# replica reports its pace after 4 requests; these only order cold replicas.
DEFAULT_PREFILL_S_PER_TOKEN = 1e-3
COLD_WAIT_PER_REQUEST_S = 0.05
PENDING_MAX_S = 60.0  # a sent request never reported back stops counting after this long
MAX_RETRY_AFTER_S = 60
# x-session-id hints remembered (least recent forgotten). A hint counts only for a prompt whose tokens are not known
# here (its tokenizer did not load at the ingress): the session's last replica is taken to hold its previous prompt.
SESSIONS = 10_000
_TIMINGS = 1024  # decision times kept for the p99


@dataclass
class _Replica:
    blocks: BlockLRU
    cache_blocks: int = 0  # the replica's whole cache, in blocks (the estimate's size grows back towards it)
    load: ReplicaLoad | None = None
    seen_at: float = 0.0  # when its load last changed here
    pending: dict[int, tuple[float, float]] = field(default_factory=dict)  # key -> (prefill s, sent at)
    prefilling: dict[int, int] = field(default_factory=dict)  # block name -> requests sent whose prefill computes it
    unconfirmed: set[int] = field(default_factory=set)  # names expected from requests sent, none answered yet
    prefilled: set[int] = field(default_factory=set)  # keys of pending requests past their first output
    figures: ReplicaRouting = field(default_factory=ReplicaRouting)


def _per_request_s(state: _Replica) -> float:
    """What one more request in the batch adds to a first token there (the cold estimate until measured)."""
    measured = state.load.per_request_s if state.load is not None else None
    return measured if measured is not None else COLD_WAIT_PER_REQUEST_S


def _p99_ms(seconds: deque[float]) -> float | None:
    return round(float(np.quantile(np.asarray(seconds), 0.99)) * 1000, 3) if seconds else None


class FleetRouter:
    def __init__(self, stats_period_s: float = 0.5, rng: random.Random | None = None):
        self._stats_period_s = stats_period_s
        self._rng = rng or random.Random()
        self._replicas: dict[str, _Replica] = {}
        self._keys = count(1)
        self._sessions: OrderedDict[str, tuple[str, int]] = OrderedDict()  # session -> (replica, prompt tokens)
        self._decision_s: deque[float] = deque(maxlen=_TIMINGS)  # wall time
        # ... and the CPU time of the thread deciding: the router's own work, without the time the thread waited for
        # a core or the GIL (on 2 cores shared with two engines and the ingress's renderer, most of the wall p99).
        self._decision_cpu_s: deque[float] = deque(maxlen=_TIMINGS)
        self.refused = 0

    # -- choosing ----------------------------------------------------------------------------

    def choose(self, loads: Mapping[str, ReplicaLoad], prompt_ids: Sequence[int] | None,
               first_token_target_s: float | None = None, avoid: frozenset[str] = frozenset(),
               session: str = "", salt: str | None = None) -> Decision | None:
        """The replicas ranked for this request (None: no replica known yet); `decision.refusal` set when even the
        soonest misses `first_token_target_s`. `avoid`: replicas that refused it already (left out while others
        remain). `salt`: the request's cache_salt, which names its prefix blocks as the engine names them."""
        started, started_cpu = time.perf_counter(), time.thread_time()
        now = time.monotonic()
        self._track(loads, now)
        block = next((load.block_tokens for load in loads.values() if load.block_tokens), 0)
        names = block_hashes(prompt_ids, block, salt) if prompt_ids and block else ()
        tokens = len(prompt_ids or ())
        hit_blocks = cacheable_blocks(tokens, block) if block else 0
        serving = [r for r in loads if loads[r].serving] or list(loads)
        pool = [r for r in serving if r not in avoid] or serving
        if not pool:
            return None
        rates = [load.prefill_s_per_token for load in loads.values() if load.prefill_s_per_token is not None]
        default_rate = float(np.median(rates)) if rates else DEFAULT_PREFILL_S_PER_TOKEN
        hinted = self._sessions.get(session) if session and not names else None
        if hinted is not None:  # its tokens unknown here: at least its conversation's previous prompt, held there
            tokens = max(tokens, hinted[1])
        candidates = []
        for replica in pool:
            state, load = self._replicas[replica], loads[replica]
            cached = state.blocks.match(names[:hit_blocks]) * block
            if hinted is not None and hinted[0] == replica:
                cached = cacheable_blocks(hinted[1], block) * block if block else hinted[1]
            rate = load.prefill_s_per_token if load.prefill_s_per_token is not None else default_rate
            measured = load.wait_s is not None
            wait = load.wait_s if load.wait_s is not None else COLD_WAIT_PER_REQUEST_S * load.in_system
            first = wait + self._pending_s(state, now) + rate * max(0, tokens - cached)
            candidates.append(Candidate(replica, first, cached, measured))
        with_room = {c.replica for c in candidates
                     if loads[c.replica].room - len(self._replicas[c.replica].pending) > 0}
        candidates, near, soonest = rank(candidates, with_room, names[0] if names else None, self._rng)
        best = candidates[0]
        decision = Decision(next(self._keys), tuple(candidates), names, tokens, block,
                            self._refusal(soonest, loads[soonest.replica], len(candidates), first_token_target_s,
                                          len(prompt_ids) if prompt_ids else None), session, near)
        if decision.refusal is None:
            self._sent(decision, best, now)
            self._remember(session, best.replica, tokens)
        else:
            self.refused += 1
        self._decision_s.append(time.perf_counter() - started)
        self._decision_cpu_s.append(time.thread_time() - started_cpu)
        return decision

    def _remember(self, session: str, replica: str, prompt_tokens: int) -> None:
        if session:
            self._sessions[session] = (replica, prompt_tokens)
            self._sessions.move_to_end(session)
            while len(self._sessions) > SESSIONS:
                self._sessions.popitem(last=False)

    def _refusal(self, best: Candidate, load: ReplicaLoad, replicas: int, target_s: float | None,
                 prompt_tokens: int | None) -> OverTimeTarget | None:
        if target_s is None or not best.measured or load.in_system == 0 or best.first_token_s <= target_s:
            return None
        refusal = OverTimeTarget(
            f"Server is busy: this request's first token is predicted in {best.first_token_s:.1f} s on the soonest of "
            f"{replicas} replica(s), later than its {target_s:g} s target; retry after the Retry-After delay (or "
            "send a shorter prompt)",
            retry_after_s=min(MAX_RETRY_AFTER_S, max(1, math.ceil(best.first_token_s - target_s))),
        )
        refusal.prompt_tokens = prompt_tokens
        return refusal

    def _sent(self, decision: Decision, to: Candidate, now: float) -> None:
        """The request goes to `to`: its prefill and its place in the batch count there until its first output, and
        its blocks are expected there from now on (a request with the same prefix right after it should follow)."""
        state = self._replicas[to.replica]
        load = state.load or ReplicaLoad()
        rate = load.prefill_s_per_token if load.prefill_s_per_token is not None else DEFAULT_PREFILL_S_PER_TOKEN
        per_request = _per_request_s(state)
        state.pending[decision.key] = (per_request + rate * max(0, decision.prompt_tokens - to.cached_tokens), now)
        for name in decision.names:
            state.prefilling[name] = state.prefilling.get(name, 0) + 1
        # Only its new blocks for now: the ones held keep their place in the LRU order until the engine confirms them
        # (`answered`), so that a miss forgets what is older than them, not what was used after.
        new = decision.names[to.cached_tokens // decision.block_tokens if decision.block_tokens else 0:]
        state.blocks.add(new)
        if len(state.unconfirmed) > 2 * state.blocks.capacity:  # requests never reported back: start again
            state.unconfirmed.clear()
        state.unconfirmed.update(new)
        state.figures.routed += 1

    def _pending_s(self, state: _Replica, now: float) -> float:
        """Work sent to the replica that its latest figures do not show yet: what was sent up to two polls before
        they came (a poll, then its broadcast) is taken as shown."""
        for key in [k for k, (_, sent) in state.pending.items() if now - sent > PENDING_MAX_S]:
            del state.pending[key]
            state.prefilled.discard(key)
        shown_before = state.seen_at - 2 * self._stats_period_s
        return sum(s for s, sent in state.pending.values() if sent >= shown_before)

    def _track(self, loads: Mapping[str, ReplicaLoad], now: float) -> None:
        for replica in [r for r in self._replicas if r not in loads]:  # gone: a replacement has another id
            del self._replicas[replica]
        for replica, load in loads.items():
            state = self._replicas.get(replica)
            if state is None:
                state = self._replicas[replica] = _Replica(BlockLRU(max(1, load.cache_blocks)), load.cache_blocks)
            if load != state.load:
                state.load, state.seen_at = load, now
                if load.cache_blocks and load.cache_blocks != state.cache_blocks:
                    state.cache_blocks = state.blocks.capacity = load.cache_blocks

    # -- learning ----------------------------------------------------------------------------

    def answered(self, decision: Decision, replica: str, cached_tokens: int | None, first_token_s: float,
                 prompt_tokens: int | None = None) -> None:
        """The request's first output came from `replica` after `first_token_s`, its engine having found
        `cached_tokens` of its `prompt_tokens` in the prefix cache (None: not reported)."""
        state = self._replicas.get(replica)
        self._release(decision, keep_in_batch=True)
        if prompt_tokens is not None:
            self._remember(decision.session, replica, prompt_tokens)
        if state is None:
            return
        figures = state.figures
        predicted = decision.predicted_for(replica)
        if predicted is not None:
            figures.first_tokens += 1
            figures.predicted_first_token_s += predicted.first_token_s
            figures.measured_first_token_s += first_token_s
        if cached_tokens is None or not decision.block_tokens:
            return
        expected = predicted.cached_tokens if predicted is not None else 0
        figures.predicted_cached_tokens += expected
        figures.realized_cached_tokens += cached_tokens
        figures.confirmed_cached_tokens += min(expected, cached_tokens)
        hit, expected_blocks = cached_tokens // decision.block_tokens, expected // decision.block_tokens
        missed = [n for n in decision.names[hit:expected_blocks] if n not in state.prefilling]
        if missed:  # the engine evicted a block the estimate held, and (LRU) every block used less recently
            state.blocks.forget_through(missed[0])
            state.blocks.forget(missed)
            state.blocks.capacity = max(1, min(state.blocks.capacity, len(state.blocks) + len(decision.names)))
        elif expected_blocks:  # confirmed: the estimate may grow back towards the whole cache
            state.blocks.capacity = min(max(1, state.cache_blocks), state.blocks.capacity + expected_blocks)
        state.blocks.add(decision.names)  # its prefill computed them all: the replica holds them now
        state.unconfirmed.difference_update(decision.names)
        first = self._replicas.get(decision.ranked[0])
        if replica != decision.ranked[0] and first is not None:  # Serve sent it elsewhere than the first choice
            first.blocks.forget(decision.names[decision.candidates[0].cached_tokens // decision.block_tokens:])

    def ended(self, decision: Decision) -> None:
        """The request ended without an answer (refused, failed, cancelled): its prefill no longer counts, and the
        blocks it would have computed are not expected where it was sent."""
        sent_to = [state for state in self._replicas.values() if decision.key in state.pending]
        self._release(decision)
        for state in sent_to:
            never = [n for n in decision.names if n in state.unconfirmed and n not in state.prefilling]
            state.blocks.forget(never)
            state.unconfirmed.difference_update(never)

    def _release(self, decision: Decision, keep_in_batch: bool = False) -> None:
        """Its prefill is done (or will never be): its blocks are no longer being computed, and its pending work
        is only its place in the batch (`keep_in_batch`, until `finished`) or nothing."""
        for state in self._replicas.values():
            entry = state.pending.pop(decision.key, None)
            if entry is None:
                continue
            if keep_in_batch:
                state.pending[decision.key] = (_per_request_s(state), entry[1])
            if decision.key in state.prefilled:
                continue
            state.prefilled.add(decision.key)
            for name in decision.names:
                left = state.prefilling.get(name, 0) - 1
                if left > 0:
                    state.prefilling[name] = left
                else:
                    state.prefilling.pop(name, None)

    def finished(self, decision: Decision) -> None:
        """The request's stream ended after answering: it no longer counts where it ran."""
        for state in self._replicas.values():
            state.pending.pop(decision.key, None)
            state.prefilled.discard(decision.key)

    # -- figures -----------------------------------------------------------------------------

    def figures(self) -> FleetFigures:
        for state in self._replicas.values():
            state.figures.estimated_blocks = len(state.blocks)
        return FleetFigures(replicas={r: replace(state.figures) for r, state in self._replicas.items()},
                            refused=self.refused, decision_p99_ms=_p99_ms(self._decision_s),
                            decision_cpu_p99_ms=_p99_ms(self._decision_cpu_s))

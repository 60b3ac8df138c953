"""SimReplica: one engine replica in simulated time, with the fake engine's cost model (app/engine/fake.py), and
what it tells the autoscaling policy (the figures of app/host/replica_load.scaling_figures)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from app.host.demand import DemandMeter, effective_capacity


@dataclass(frozen=True)
class CostModel:
    """The fake engine's cost model: prefill takes `prefill_s_per_token` per prompt token, one prompt at a time, and
    stalls decoding meanwhile (vLLM's CPU backend runs a prefill chunk inside the step); a decode step takes
    `token_delay_s + decode_s_per_batch x streams`. The defaults give one replica about 500 output tokens/s at its
    full batch of 32, the order of the default model's on a 2-core CPU (docs/sizing.md)."""

    prefill_s_per_token: float = 3e-4
    token_delay_s: float = 0.03
    decode_s_per_batch: float = 1e-3
    max_num_seqs: int = 32

    def step_s(self, batch: int) -> float:
        return self.token_delay_s + self.decode_s_per_batch * batch

    def capacity(self) -> float:
        """Output tokens per second at a full batch (what a replica's pace reports as `capacity`)."""
        return self.max_num_seqs / self.step_s(self.max_num_seqs)


@dataclass
class Job:
    """One request: it arrives, waits, is prefilled, then decodes `output` tokens (the first comes with its
    prefill)."""

    arrival: float
    prompt: int
    max_tokens: int
    output: int
    prefill_left_s: float = 0.0
    left: float = 0.0  # output tokens still to make
    first_token: float | None = None
    done_at: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival


class SimReplica:
    def __init__(self, cost: CostModel, ready_at: float):
        self.cost = cost
        self.ready_at = ready_at  # when it has loaded its model and serves
        self.stopping_since: float | None = None  # Serve is stopping it: it takes nothing new, finishes what it has
        self.queue: deque[Job] = deque()
        self.running: list[Job] = []
        self.meter = DemandMeter()
        self._mix = [0.0, 0.0]  # prompt and output tokens of the requests it finished (the replica's pace keeps them)

    def serving(self, now: float) -> bool:
        return now >= self.ready_at and self.stopping_since is None

    @property
    def ongoing(self) -> int:
        return len(self.running) + len(self.queue)

    def advance(self, now: float, dt: float) -> list[Job]:
        """Runs the engine from `now` for `dt` seconds; the jobs that finished."""
        done: list[Job] = []
        spent = 0.0
        while spent < dt - 1e-12:
            while self.queue and len(self.running) < self.cost.max_num_seqs:
                job = self.queue.popleft()
                if job.first_token is None:
                    job.left = float(job.output)
                # A continuation (moved from a stopped replica) prefills its prompt and the tokens made so far.
                made = job.output - job.left
                job.prefill_left_s = (job.prompt + made) * self.cost.prefill_s_per_token
                self.running.append(job)
            prefilling = next((j for j in self.running if j.prefill_left_s > 1e-12 or j.first_token is None), None)
            if prefilling is not None:
                used = min(dt - spent, prefilling.prefill_left_s)
                prefilling.prefill_left_s -= used
                spent += used
                if prefilling.prefill_left_s <= 1e-12 and prefilling.first_token is None:
                    prefilling.first_token, prefilling.left = now + spent, prefilling.left - 1
                    self.meter.served(1, now)
                    if prefilling.left <= 1e-9:
                        prefilling.done_at = now + spent
                        self.running.remove(prefilling)
                        done.append(prefilling)
                continue
            if not self.running:
                break
            step = self.cost.step_s(len(self.running))
            steps = min(min(j.left for j in self.running), (dt - spent) / step)
            for job in self.running:
                job.left -= steps
            spent += steps * step
            self.meter.served(steps * len(self.running), now)
            for job in [j for j in self.running if j.left <= 1e-9]:
                job.done_at = now + spent
                self._mix[0] += job.prompt
                self._mix[1] += job.output
                self.running.remove(job)
                done.append(job)
        return done

    def first_token_s(self, prompt: int) -> float:
        """When a newcomer's first token would come: after a slot frees for it (running streams end at their
        remaining output at the full batch's pace), and the prefill of every prompt ahead of it and its own."""
        rate = self.cost.prefill_s_per_token
        ahead = sum(j.prefill_left_s for j in self.running) + rate * sum(j.prompt for j in self.queue)
        waiting_for = len(self.queue) - (self.cost.max_num_seqs - len(self.running))
        start = 0.0
        if waiting_for >= 0 and self.running:
            step = self.cost.step_s(len(self.running))
            ends = sorted(j.left * step for j in self.running)
            rounds, index = divmod(waiting_for, len(ends))
            start = ends[index] + rounds * ends[-1]
        return start + ahead + rate * prompt

    def figures(self, now: float, output_share: float) -> dict[str, float]:
        """What the replica reports to Serve (app/host/replica_load.scaling_figures, and Serve's own count)."""
        served, refused = self.meter.rates(now)
        busy = bool(self.running or self.queue)
        capacity = effective_capacity(self.cost.capacity(), self.cost.prefill_s_per_token,
                                      self._mix[0] / self._mix[1] if self._mix[1] else 0.0)
        return {"served": served, "refused": refused, "capacity": capacity,
                "wait_s": self.first_token_s(0) if busy else 0.0, "ongoing": float(self.ongoing),
                "waiting": float(len(self.queue)), "output_share": output_share}

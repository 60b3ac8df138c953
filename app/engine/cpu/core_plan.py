"""Which cores a CPU engine computes on and which the front end keeps, as vLLM 0.32 binds them; the start-up line.

vLLM's CPU worker binds one OpenMP thread per physical core of its memory node and reserves the last core(s) for
the front end (vllm/utils/ompmultiprocessing.py `OMPProcessManager`); `plan_cores` predicts that split (or sets
it, where vLLM's own would fail) so it can be logged and shown in /stats; `app/engine/cpu/openmp.py` hands it to the
EngineCore, which computes itself, and `app/engine/cpu/affinity.py` moves the front end off it after start.
`describe` is the one start-up line.

    plan_cores(cores=None, ...) -> CorePlan        # plan.env: only for the engine processes spawned; log warnings
    describe(choice, plan, kv_cache_gib, kv_cache_tokens=None) -> str
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from app.engine.cpu.facts import CpuTopology, LogicalCpu, format_id_list, normalise_arch, parse_id_list, read_topology
from app.engine.cpu.precision import PrecisionChoice


@dataclass(frozen=True)
class CorePlan:
    compute_by_rank: tuple[tuple[int, ...], ...]  # per CPU worker (tensor-parallel rank): the cores its OpenMP
    #                                               threads are bound to, one thread per core
    front_end_cores: tuple[int, ...]   # usable cores no worker computes on: cpu/affinity.py moves the replica
    #                                    and the EngineCore there; empty: they share the compute cores
    usable_cores: tuple[int, ...]
    source: str                        # "vllm-auto" | "explicit" | "env" (operator's VLLM_CPU_OMP_THREADS_BIND)
    #                                    | "nobind"
    env: Mapping[str, str] = field(default_factory=dict)  # in the spawned engine processes only; {}: vLLM's own binding
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def compute_cores(self) -> tuple[int, ...]:
        return tuple(sorted({c for rank in self.compute_by_rank for c in rank}))

    @property
    def threads_per_rank(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self.compute_by_rank)  # vLLM sets OMP_NUM_THREADS to this per worker


def _arch_reserve(arch: str, world_size: int) -> int:
    # vllm/utils/ompmultiprocessing.py `OMPProcessManager.__init__`: one core per local worker on x86/ARM/RISC-V
    # ("reserve ... core for scheduler proc as always use MP executor"), one elsewhere.
    return world_size if arch in ("x86_64", "aarch64") or arch.startswith("riscv") else 1


def _select_per_core(cpus: list[LogicalCpu], arch: str) -> list[LogicalCpu]:
    """One OpenMP thread per physical core, as vLLM's auto binding: the highest-numbered SMT sibling on x86 and
    s390x (`cpus[-1:]`), every CPU on ARM/RISC-V (no SMT), the first four of each eight on POWER (SMT-8)."""
    if arch.startswith("ppc"):
        return sorted(c for c in cpus if c.id % 8 < 4)
    if arch == "aarch64" or arch.startswith("riscv"):
        return sorted(cpus)
    by_core: dict[int, list[LogicalCpu]] = {}
    for c in cpus:
        by_core.setdefault(c.core, []).append(c)
    return sorted(max(group) for group in by_core.values())


def _take_reserve(ranks: list[list[int]], reserve: int, keep_one: bool = False) -> tuple[list[list[int]], list[int]]:
    """vLLM's split (`_get_autobind_cpu_ids`): `reserve` cores taken off the ends of the ranks' lists, spread evenly,
    the remainder from the last ranks; none at all when the ranks hold no more cores than `reserve` (vLLM then warns
    and computes on everything, sharing with the front end). `keep_one`: never empty a rank (vLLM does not check)."""
    total = sum(len(r) for r in ranks)
    if total <= reserve or not ranks:
        return [list(r) for r in ranks], []
    n = len(ranks)
    per = [reserve // n] * n
    for i in range(n - 1, n - 1 - reserve % n, -1):
        per[i] += 1
    reserved: list[int] = []
    out: list[list[int]] = []
    for r, k in zip(ranks, per, strict=True):
        if keep_one:
            k = min(k, len(r) - 1)
        k = max(min(k, len(r)), 0)
        reserved.extend(r[len(r) - k:])
        out.append(r[:len(r) - k])
    return out, reserved


def plan_cores(cores: Iterable[int] | None = None, *, topology: CpuTopology | None = None, arch: str | None = None,
               world_size: int = 1, environ: Mapping[str, str] | None = None, explicit: bool = False) -> CorePlan:
    """What vLLM 0.32's CPU worker will bind to (vllm/utils/ompmultiprocessing.py `OMPProcessManager`), reproduced.

    By default vLLM binds itself (VLLM_CPU_OMP_THREADS_BIND=auto) and that is kept: its split is the one the
    2-core measurements were made with (+3.5 to +4 % tok/s once the front end also keeps off the compute core,
    docs/benchmarks.md), and it binds the worker's memory to the same NUMA node. Per core count, one NUMA node, no
    SMT: 1 core: compute on it, nothing reserved, the front end shares it (vLLM warns); 2: compute 0, front end 1;
    4: 0-2 | 3; 8: 0-6 | 7; 16: 0-14 | 15. One core for the front end at 16 cores is vLLM's choice, not measured
    here. With SMT only one sibling per core computes and the others join the front end. With TP=1 vLLM computes
    on the first memory node's cores only; the other nodes' cores are left to the front end.

    The plan sets the binding explicitly (`env`) only where vLLM's own would fail: more workers than memory nodes
    (vLLM asserts), or a rank left with no core (its node has none of the usable cores, or the reserve took them);
    or when `explicit` asks for it (to pin what was planned). An operator's VLLM_CPU_OMP_THREADS_BIND is honoured
    and only described. `world_size` is the CPU workers per engine (tensor_parallel_size x pipeline stages)."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    env = os.environ if environ is None else environ
    topo = topology or read_topology(cores, environ=env)
    if cores is not None:
        keep = set(cores)
        topo = CpuTopology(tuple(c for c in topo.cpus if c.id in keep), topo.mem_nodes)
    arch_n = normalise_arch(platform.machine() if arch is None else arch)
    usable = tuple(sorted(c.id for c in topo.cpus))
    notes: list[str] = []
    warnings: list[str] = []
    plan_env: dict[str, str] = {}
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "auto").strip() or "auto"
    if bind == "nobind":
        notes.append("VLLM_CPU_OMP_THREADS_BIND=nobind: OpenMP threads are not bound; the front end shares the cores")
        ranks, source = [list(usable)], "nobind"
    elif bind != "auto":
        ranks, source = _operator_binding(bind, world_size, usable, warnings), "env"
    else:
        reserve = _reserve(env, arch_n, world_size, warnings)
        ranks, fallback = _automatic_binding(topo, arch_n, world_size, reserve, notes, warnings)
        source = "explicit" if fallback or explicit else "vllm-auto"
        if source == "explicit":
            plan_env = {"VLLM_CPU_OMP_THREADS_BIND": "|".join(format_id_list(r) for r in ranks)}
    compute = {c for r in ranks for c in r}
    front = tuple(c for c in usable if c not in compute)
    return CorePlan(tuple(tuple(r) for r in ranks), front, usable, source, plan_env, tuple(notes), tuple(warnings))


def _operator_binding(bind: str, world_size: int, usable: tuple[int, ...], warnings: list[str]) -> list[list[int]]:
    """An operator's VLLM_CPU_OMP_THREADS_BIND, honoured as given; what vLLM will make of it goes to `warnings`."""
    given = [parse_id_list(s) for s in bind.split("|")]
    if len(given) != world_size:
        warnings.append(f"VLLM_CPU_OMP_THREADS_BIND={bind!r} names {len(given)} core lists for {world_size} "
                        "worker(s): vLLM will refuse to start")
    outside = sorted({c for r in given for c in r} - set(usable))
    if outside:
        warnings.append(f"VLLM_CPU_OMP_THREADS_BIND binds to cores {format_id_list(outside)} this process may "
                        "not use")
    return given


def _reserve(env: Mapping[str, str], arch_n: str, world_size: int, warnings: list[str]) -> int:
    """The cores vLLM keeps off compute for its front end: its minimum, or the operator's count."""
    minimum = _arch_reserve(arch_n, world_size)
    if "VLLM_CPU_NUM_OF_RESERVED_CPU" not in env:
        return minimum
    reserve = int(env["VLLM_CPU_NUM_OF_RESERVED_CPU"] or 0)
    if reserve < minimum:
        warnings.append(f"VLLM_CPU_NUM_OF_RESERVED_CPU={reserve} is below vLLM's minimum of {minimum}")
    return reserve


def _automatic_binding(topo: CpuTopology, arch_n: str, world_size: int, reserve: int, notes: list[str],
                       warnings: list[str]) -> tuple[list[list[int]], bool]:
    """vLLM's own binding (rank N on the N-th memory node's cores, less the reserve), and whether it would fail and
    an explicit even split is used instead."""
    usable = tuple(sorted(c.id for c in topo.cpus))
    rank_nodes = topo.mem_nodes[:world_size]
    fallback = len(topo.mem_nodes) < world_size
    selected: list[list[int]] = []
    ranks: list[list[int]] = []
    reserved: list[int] = []
    if not fallback:
        for node in rank_nodes:  # rank N computes on the N-th memory node's cores
            selected.append([c.id for c in _select_per_core([c for c in topo.cpus if c.node == node], arch_n)])
        ranks, reserved = _take_reserve(selected, reserve)
        fallback = any(not r for r in ranks)
    if fallback:
        # vLLM's automatic binding would fail (assert) or bind a worker to no core; split instead, one CPU per
        # physical core, evenly and in order, and tell vLLM so.
        picked = [c.id for c in _select_per_core(list(topo.cpus), arch_n)]
        size = max(len(picked) // world_size, 1)
        selected = [picked[i * size:(i + 1) * size] or picked[-1:] for i in range(world_size)]
        ranks, reserved = _take_reserve(selected, reserve, keep_one=True)
        rank_nodes = tuple(sorted({c.node for c in topo.cpus}))
        warnings.append(f"vLLM's automatic binding cannot place {world_size} worker(s) on memory node(s) "
                        f"{list(topo.mem_nodes)} with cores {format_id_list(usable)}: binding explicitly")
    chosen = {c for r in selected for c in r}
    elsewhere = [c.id for c in topo.cpus if c.node not in rank_nodes]
    siblings = [c.id for c in topo.cpus if c.node in rank_nodes and c.id not in chosen]
    if elsewhere:
        notes.append(f"cores {format_id_list(elsewhere)} are on other NUMA nodes and do no compute "
                     f"(one worker per node: tensor_parallel_size={len(topo.mem_nodes)} would use them)")
    if siblings:
        notes.append(f"SMT siblings {format_id_list(siblings)} do no compute (one thread per physical core)")
    if not reserved and reserve > 0:
        warnings.append(f"{len(usable)} usable core(s): none can be kept for the front end, which shares the "
                        "compute cores and slows every step")
    return ranks, fallback


# ---------------------------------------------------------------------------------------------------------------
# The start-up line


_SOURCE = {"vllm-auto": "vLLM's own binding", "explicit": "bound by this plan", "env": "VLLM_CPU_OMP_THREADS_BIND",
           "nobind": "not bound"}


def describe(choice: PrecisionChoice, plan: CorePlan | None, kv_cache_gib: float | None,
             kv_cache_tokens: int | None = None) -> str:
    """One line: precision and why, compute cores, front-end cores, KV cache size."""
    parts = [f"precision {choice.dtype} ({choice.reason})"]
    if plan is None:
        parts.append("compute on the GPU")
    else:
        ranks = " | ".join(format_id_list(r) or "none" for r in plan.compute_by_rank)
        threads = "+".join(str(t) for t in plan.threads_per_rank)
        how = _SOURCE[plan.source]
        parts.append(f"compute cores {ranks} ({threads} thread{'s' if plan.threads_per_rank != (1,) else ''}, {how})")
        front = format_id_list(plan.front_end_cores)
        parts.append(f"front-end cores {front}" if front else "front-end cores none (shares the compute cores)")
    kv = f"KV cache {kv_cache_gib:g} GiB" if kv_cache_gib else "KV cache sized by vLLM"
    if kv_cache_tokens:
        kv += f" ({kv_cache_tokens} tokens)"
    parts.append(kv)
    return "; ".join(parts)

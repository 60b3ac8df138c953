"""loadkit.hostile on made-up results: the lag histogram's deltas and percentile bounds, the server-side close
view, the hand-built bytes, the polite client's figures, the targets and the rendered report (no service is
started; the socket probes run on a loopback pair of this process's own)."""

from __future__ import annotations

import math
import select
import socket
import struct
from pathlib import Path

import pytest
import yaml

from loadkit.hostile import run as hostile_cli
from loadkit.hostile.attack import GIANT, TOKENIZE, Attack, mark_released
from loadkit.hostile.plan import HUGE_FAST, HUGE_SLOW, IDLE, NON_READER, SLOWLORIS, Clocks, Plan
from loadkit.hostile.polite import longest_unserved_s, served_again_s
from loadkit.hostile.report import DOC, evaluate, render, vector_text
from loadkit.hostile.result import HostileResult
from loadkit.hostile.server_view import (
    EngineFacts,
    Sample,
    engine_outcomes,
    max_range,
    parse_histogram,
    parse_send_queues,
    quantile_bound,
)
from loadkit.hostile.sockets import (
    HeaderDrip,
    SocketRecord,
    hangup,
    huge_header_block,
    peek,
    request_bytes,
    status_of,
    unread,
)
from loadkit.machine import Commit, CpuFacts, Machine
from loadkit.markdown import write_section
from loadkit.record import Record
from loadkit.report import Check, RunFacts
from loadkit.server_stats import Idle, Stats
from loadkit.service import NotLoopback, loopback_url

REPO = Path(__file__).resolve().parents[2]
EDGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, math.inf)


def _metrics(counts: list[int], total: float) -> str:
    """Prometheus text of app_event_loop_lag_seconds with `counts` per bucket (not cumulative)."""
    lines, cumulative = ["# TYPE app_event_loop_lag_seconds histogram"], 0
    for le, n in zip(EDGES, counts, strict=True):
        cumulative += n
        edge = "+Inf" if math.isinf(le) else repr(le)
        lines.append(f'app_event_loop_lag_seconds_bucket{{le="{edge}"}} {float(cumulative)}')
    lines += [f"app_event_loop_lag_seconds_count {float(cumulative)}", f"app_event_loop_lag_seconds_sum {total}",
              'app_requests_total{model="m"} 5.0']
    return "\n".join(lines) + "\n"


# -- the lag histogram -----------------------------------------------------------------------------------------

def test_histogram_deltas_bound_the_p99_by_the_bucket_edge():
    before = parse_histogram(_metrics([100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.05))
    after = parse_histogram(_metrics([1085, 0, 0, 10, 3, 0, 2, 0, 0, 0, 0, 0, 0], 0.6))
    window = after.minus(before)
    assert window.count == 1000 and window.total == pytest.approx(0.55)
    assert quantile_bound(window, 0.99) == 0.01  # 985 + 10 = 995 of 1000 heartbeats at or under 10 ms
    assert quantile_bound(window, 0.999) == 0.1
    assert max_range(window) == (0.05, 0.1)
    assert window.mean == pytest.approx(0.00055)


def test_a_lag_past_the_last_edge_is_unbounded_and_an_empty_window_has_no_quantile():
    h = parse_histogram(_metrics([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3], 30.0))
    assert quantile_bound(h, 0.99) == math.inf and max_range(h) == (5.0, math.inf)
    empty = h.minus(h)
    assert quantile_bound(empty, 0.99) is None and max_range(empty) is None
    assert parse_histogram("app_other_seconds_count 1\n") is None


# -- which sockets the server let go of ------------------------------------------------------------------------

def test_a_socket_the_server_held_and_no_longer_holds_is_released():
    held, never_seen, late = SocketRecord(IDLE, 0, 1001, 1.0), SocketRecord(IDLE, 1, 1002, 1.0), \
        SocketRecord(IDLE, 2, 1003, 5.0)
    mark_released([held, never_seen, late], {1001, 1002}, sampled_at=2.0)
    assert held.seen_by_server and never_seen.seen_by_server and held.released_at is None
    mark_released([held, never_seen, late], {1002}, sampled_at=3.0)
    assert held.released_at == 3.0 and never_seen.released_at is None
    assert late.released_at is None and not late.seen_by_server  # opened after the look: left for the next one
    held.closed_at = 2.5
    assert held.ended_at == 2.5 and held.time_to_end == 1.5


def test_a_socket_the_client_saw_closed_and_the_server_never_listed_is_released_at_the_next_look():
    rec = SocketRecord(HUGE_FAST, 0, 2001, 1.0)
    rec.saw_close("reset", at=1.2)
    mark_released([rec], set(), sampled_at=2.0)
    assert rec.released_at == 2.0 and rec.ended_at == 1.2 and rec.how == "reset"


def test_the_servers_send_queues_by_client_port_from_proc_net_tcp():
    text = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
            "   0: 0100007F:1F90 0100007F:D431 01 0001A000:00000000 00:00000000 00000000     0        0 1\n"
            "   1: 0100007F:D431 0100007F:1F90 01 00000000:00001000 00:00000000 00000000     0        0 2\n"
            "   2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3\n")
    assert parse_send_queues(text, 0x1F90) == {0xD431: 0x1A000, 0: 0}


def test_the_service_logs_engine_requests_are_counted_by_outcome():
    log = "\n".join([
        '(ServeReplica pid=1) {"message": "engine request", "outcome": "client_gone", "generated_tokens": 225}',
        '(ServeReplica pid=1) {"message": "engine request", "outcome": "client_gone", "generated_tokens": 220}',
        '(ServeReplica pid=1) {"message": "engine request", "outcome": "queue_timeout"}',
        '{"message": "request", "status": 200}', "not json at all"])
    assert engine_outcomes(log) == ({"client_gone": 2, "queue_timeout": 1}, {"client_gone": 225, "queue_timeout": 0})


# -- the bytes sent ---------------------------------------------------------------------------------------------

def test_the_drip_never_ends_its_headers_and_the_huge_block_does():
    drip = HeaderDrip("127.0.0.1:9")
    sent = b"".join(drip.next_byte() for _ in range(5000))
    assert sent.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and b"\r\n\r\n" not in sent
    block = huge_header_block("h", 2**20)
    assert abs(len(block) - 2**20) < 2000 and block.endswith(b"\r\n\r\n") and block.count(b"\r\n\r\n") == 1


def test_request_bytes_and_status_line():
    raw = request_bytes("POST", "/x", "h:1", {"A": "b"}, b"{}")
    assert raw == b"POST /x HTTP/1.1\r\nHost: h:1\r\nA: b\r\nContent-Length: 2\r\n\r\n{}"
    assert status_of(b"HTTP/1.1 408 Request Timeout\r\n") == 408 and status_of(b"garbage") is None


# -- seeing a close without reading -------------------------------------------------------------------------------

@pytest.fixture
def pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    yield client, server
    client.close()
    server.close()


def _wait_readable(sock: socket.socket) -> None:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)
    assert poller.poll(5000), "nothing arrived"  # waits for the condition, no fixed sleep


def test_a_close_behind_unread_data_is_seen_by_poll_and_leaves_the_data_unread(pair):
    client, server = pair
    assert hangup(client) is None and peek(client) == "open, nothing pending"
    server.sendall(b"x" * 100)
    server.close()
    _wait_readable(client)
    assert hangup(client) in ("pollrdhup", "pollhup") and unread(client) == 100 and peek(client) == "data pending"


def test_a_reset_is_seen_as_one(pair):
    client, server = pair
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server.close()  # SO_LINGER 0: a reset, not a FIN
    _wait_readable(client)
    assert hangup(client) == "reset"


# -- the polite client's figures ---------------------------------------------------------------------------------

def _polite(start: float, status: int | None, latency: float = 0.1) -> Record:
    outcome = "ok" if status == 200 else "refused" if status in (429, 503) else "timeout"
    return Record(start, start + latency, outcome, status)


def test_served_again_counts_only_requests_sent_after_the_attack_began():
    recs = [_polite(9.5, 200, 1.0), _polite(10.5, 429), _polite(11.5, None, 5), _polite(17.0, 200, 0.5),
            _polite(18.0, 200)]
    assert served_again_s(recs, 10.0) == pytest.approx(7.5)
    assert longest_unserved_s(recs, 10.0, 20.0) == pytest.approx(7.0)  # the one sent before ended at 10.5
    assert served_again_s(recs[:3], 10.0) is None


# -- targets and report -------------------------------------------------------------------------------------------

def _socket(kind: str, i: int, ended_after: float | None, how: str = "eof", answer: int | None = 408):
    rec = SocketRecord(kind, i, 3000 + i, opened_at=100.0, seen_by_server=True)
    if ended_after is not None:
        rec.saw_close(how, at=100.0 + ended_after)
        rec.answer = answer
    return rec


def _result(polite_gap: float = 4.0, lockout: float = 5.0, lag_tail: int = 1, fds_after: int = 12,
            idle_end: float | None = 6.0, stall: float = 10.0) -> HostileResult:
    plan = Plan(non_readers=2, idle=3, slowloris=1, huge_headers=2, giant_prompts=1, tokenize_requests=2)
    socks = [_socket(NON_READER, 0, 30.0, "pollrdhup", None), _socket(NON_READER, 1, 40.0, "pollrdhup", None),
             *(_socket(IDLE, i, idle_end) for i in range(3)), _socket(SLOWLORIS, 0, 5.0),
             _socket(HUGE_FAST, 0, 0.1, "reset", None), _socket(HUGE_SLOW, 0, 2.0, answer=431)]
    for rec in socks[:2]:  # their kernels accepted bytes until 6 s before the server cut them off
        assert rec.ended_at is not None
        rec.accepted_bytes, rec.last_accepted_at = 8192, rec.ended_at - 6.0
    polite = [_polite(97.0, 200), _polite(99.0, 200), _polite(101.0, 429), _polite(100.0 + polite_gap, 200),
              *(_polite(float(t), 200) for t in range(int(100 + polite_gap + lockout), 180, 5)),
              *(_polite(t, 200) for t in (181.0, 182.0, 183.0))]
    attack = Attack(started=100.0, ended=180.0, answers=[
        Record(100.0, 100.2, status=400, code="context_length_exceeded", kind=GIANT),
        Record(101.0, 101.01, status=429, code="queue_full", kind=TOKENIZE),
        Record(102.0, 102.01, status=429, code="queue_full", kind=TOKENIZE)],
        stats=[Stats(t=150.0, engine_running=32, running=32, waiting=64, in_system=96)])
    before = parse_histogram(_metrics([0] * 13, 0.0))
    after = parse_histogram(_metrics([990, 0, 0, 0, 0, 9, lag_tail, 0, 0, 0, 0, 0, 0], 0.5))
    samples = [Sample(120.0, 600 * 2**20, 20, 10), Sample(150.0, 650 * 2**20, 15, 6)]
    return HostileResult(
        plan=plan, clocks=Clocks(header_timeout_s=5, write_stall_timeout_s=stall, source="test"), model="m",
        engine=EngineFacts("float32", "AVX2 only: no native bfloat16"), attack=attack, sockets=socks, polite=polite,
        lag_before=before, lag_after=after, baseline=Sample(99.0, 580 * 2**20, 10, 2), samples=samples,
        after=Sample(190.0, 640 * 2**20, fds_after, 2), idle_after=Idle(True, 1.5, Stats(t=189.0)),
        paris=Check(True, "HTTP 200 in 0.50 s: 'The capital of France is Paris.'"), view="the replica listens",
        leftover=[])


def test_every_target_passes_on_a_service_that_held_up():
    targets = evaluate(_result())
    assert all(t.ok for t in targets), [t.line() for t in targets if not t.ok]
    assert len(targets) == 13


@pytest.mark.parametrize(("change", "failing"), [
    ({"polite_gap": 20.0}, "polite client"),  # first 200 at 20 s > stall 10 + grace 5 (and so the longest gap)
    ({"polite_gap": 9.0, "stall": 2.0}, "polite client"),  # 9 s: in time for a 10 s stall clock, not for 2 s
    # served at once, then locked out for 60 s: longer than the non-readers' 34 s of accepting + 10 s + 5 s
    ({"lockout": 60.0}, "polite client never without a 200"),
    ({"lag_tail": 30}, "event-loop lag"),  # 39 of 1029 heartbeats over 50 ms: p99 in the 100 ms bucket
    ({"fds_after": 40}, "descriptors bounded:"),  # 30 descriptors more than before, once idle: a leak
    ({"idle_end": 9.0}, "idle, slowloris"),  # 9 s > header 5 + 3
    ({"idle_end": None}, "idle, slowloris"),  # never ended by the server
])
def test_a_target_fails_on_what_it_guards(change, failing):
    targets = evaluate(_result(**change))
    bad = [t.name for t in targets if not t.ok]
    assert bad and all(name.startswith(failing) for name in bad), bad


def test_a_non_reader_the_server_never_ended_fails_its_target():
    result = _result()
    result.sockets[1].closed_at = None
    result.sockets[1].how = ""
    bad = [t.name for t in evaluate(result) if not t.ok]
    assert bad == ["every non-reader ended by the server before the attack was over",
                   "every non-reader ended within write_stall_timeout_s + 5 s = 15 s of the last byte its kernel "
                   "accepted"]


def test_a_non_reader_cut_off_long_after_its_last_accepted_byte_fails_the_stall_clock_target():
    result = _result()
    result.sockets[0].last_accepted_at = 100.0 + 30.0 - 20.0  # accepted nothing for 20 s before its end: > 10 + 5
    bad = [t.name for t in evaluate(result) if not t.ok]
    assert bad == ["every non-reader ended within write_stall_timeout_s + 5 s = 15 s of the last byte its kernel "
                   "accepted"]


def _facts() -> RunFacts:
    cpu = CpuFacts("AMD EPYC", ("avx2",), 2, 2)
    m = Machine(cpu=cpu, usable_cpus=2, memory_gib=23.5, kernel="6.1", system="Linux", arch="x86_64", python="3.11")
    return RunFacts(command="scripts/hostile.py --duration 9", machine=m, vllm="0.32.0", commit=Commit("abc123"),
                    mode="own service")


def test_the_report_states_the_machine_the_precision_the_clocks_and_each_target(tmp_path: Path):
    result = _result(polite_gap=20.0)
    section = render(_facts(), result, evaluate(result))
    for text in ("`scripts/hostile.py --duration 9`", "AVX2 only", "2 physical core(s)", "engine.dtype): float32",
                 "header 5 s", "write stall 10 s", "| non-reader | 2 | 2 | 2 | pollrdhup: 2 |", "| idle | 3 | 3 | 3 |",
                 "400 context_length_exceeded: 1", "429 queue_full: 2", "p99 <= 1 ms, max in (50 ms, 100 ms]",
                 "| before | 580 MiB | 10 |", "| first served (200) after the attack began | 20.1 s |",
                 "(8 closed-loop clients", "**FAIL**", "**PASS**"):
        assert text in section, text
    path = tmp_path / "hostile.md"
    path.write_text("# Hostile clients\n\nHand-written intro.\n")
    write_section(path, DOC, section)
    write_section(path, DOC, section)
    text = path.read_text()
    assert text.startswith("# Hostile clients\n\nHand-written intro.\n") and text.count(DOC.begin) == 1


def test_the_vector_flags_line():
    assert vector_text(CpuFacts(flags=("avx2", "avx512f", "avx512_bf16"))) == "avx512_bf16"
    assert vector_text(CpuFacts(flags=("avx2", "avx512f"))) == "AVX-512 without bf16"
    assert vector_text(CpuFacts(flags=("avx2",))) == "AVX2 only"


# -- the service under attack ------------------------------------------------------------------------------------

def test_only_loopback_is_driven():
    assert loopback_url("http://localhost:8000") == ("127.0.0.1", 8000)
    assert loopback_url("http://[::1]:9") == ("::1", 9)
    for url in ("http://10.1.2.3:8000", "http://example.com", "https://127.0.0.1:8000"):
        with pytest.raises(NotLoopback):
            loopback_url(url)
    with pytest.raises(SystemExit):
        hostile_cli.parse_args(["--url", "http://192.168.1.5:8000"])


def test_the_own_service_config_has_a_free_port_a_key_and_the_shorter_clocks(tmp_path: Path):
    service, clocks = hostile_cli.own_service(REPO / "configs" / "cpu.yaml", {"write_stall_timeout_s": 7.0}, tmp_path)
    config = yaml.safe_load(service.config_path.read_text())
    s = config["service"]
    assert s["host"] == "127.0.0.1" and s["port"] == service.port != 8000 and s["api_keys"] == [service.api_key]
    assert (s["header_timeout_s"], s["write_stall_timeout_s"]) == (5.0, 7.0)
    assert clocks.write_stall_timeout_s == 7.0 and "lowered" in clocks.source
    assert clocks.queue_timeout_s == config["models"][0]["deployment"]["queue_timeout_s"]


def test_the_command_line_scales_its_flags_into_the_plan():
    plan = hostile_cli.plan_of(hostile_cli.parse_args(["--non-readers", "5", "--huge-header-mb", "0.5",
                                                       "--giant-prompt-kb", "100", "--duration", "12"]))
    assert (plan.non_readers, plan.huge_header_bytes, plan.giant_prompt_bytes, plan.duration_s) == (5, 2**19,
                                                                                                   100_000, 12)
    assert plan.idle == Plan().idle

"""Hostile clients against the real stack: a stream that is never read, a connection that says nothing,
giant prompts. Each must cost the service a bounded amount and nothing else must notice."""

from __future__ import annotations

import concurrent.futures
import json
import re
import socket
import uuid

import httpx
import pytest

from tests.support.service import API_KEY, MODEL
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _connect(base_url: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window stays small
    sock.connect((host, int(port)))
    return sock


def _engine_lines(service, trace_id: str) -> list[dict]:
    lines = []
    for line in service.log_path.read_text(errors="replace").splitlines():
        start = line.find("{")
        if trace_id in line and '"engine request"' in line and start >= 0:
            lines.append(json.loads(line[start:]))
    return lines


def _started(stats: dict) -> bool:
    return stats["engine"]["running"] == 1 or stats["admission"]["aside"] == 1


def test_a_stream_that_is_never_read_is_cut_off_and_its_engine_request_aborted(service):
    trace = f"non-reader-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"model": MODEL, "messages": QUESTION, "stream": True, "max_tokens": 1024,
                       "ignore_eos": True, "logprobs": True, "top_logprobs": 5}).encode()  # big chunks fill buffers
    sock = _connect(service.base_url, rcvbuf=4096)
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\nX-Request-Id: " + trace.encode() +
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        # Generating, or already set aside: the pause takes a stream that is not read out of the engine within a
        # second or two, and a poll that missed those seconds waited for `running` in vain (one CI run).
        wait_until(lambda: _started(service.stats()), timeout_s=60, interval_s=0.05, what="the stream generating")
        # Never read. The server's writes stall once the buffers are full, and after write_stall_timeout_s
        # the connection is dropped and the engine request aborted, while this socket is still open.
        wait_until(lambda: _engine_lines(service, trace), timeout_s=120, what="the request ended")
        (line,) = _engine_lines(service, trace)
        assert line["outcome"] == "client_gone" and line["generated_tokens"] < 1024
        idle = service.wait_idle(timeout_s=30)
        assert idle["engine"]["running"] == 0 and idle["admission"]["in_system"] == 0
    finally:
        sock.close()


def _read_to_end(sock: socket.socket, timeout_s: float) -> bytes:
    """The chunked response until its last chunk (the connection stays open: keep-alive)."""
    sock.settimeout(timeout_s)
    raw = b""
    while not raw.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the stream after {len(raw)} bytes"
        raw += chunk
    return raw


# Words of three letters after an x, which no word has: a grammar started again at a resume would write a second x.
PATTERN = "x( [a-wyz]{3})+"


def test_a_stream_whose_client_stops_reading_leaves_the_engine_and_ends_whole_when_it_reads_again(service):
    """The real engine, the colocated replica's connection clock: a client that stops reading is out of the engine
    within seconds (its slot free, `aside` in /stats) while its connection waits; read again before the write-stall
    clock runs out, its stream resumes from its own tokens and ends with all of them (app/host/pauses.py). A
    structured output with penalties, so that the engine resumes its grammar and counts its penalties from the tokens
    already sent (app/engine/vllm/output_resume.py): the text is one match of the pattern."""
    trace = f"pauses-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"model": MODEL, "messages": QUESTION, "stream": True, "max_tokens": 600, "ignore_eos": True,
                       "temperature": 0, "logprobs": True, "top_logprobs": 5,
                       "structured_outputs": {"regex": PATTERN}, "presence_penalty": 0.5, "frequency_penalty": 0.5,
                       "stream_options": {"include_usage": True}}).encode()
    sock = _connect(service.base_url, rcvbuf=4096)
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\nX-Request-Id: " + trace.encode() +
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_until(lambda: service.stats()["admission"]["aside"] == 1, timeout_s=60, interval_s=0.05,
                   what="the stream out of the engine")
        assert service.stats()["engine"]["running"] == 0
        raw = _read_to_end(sock, timeout_s=120)  # reading again, within the write-stall clock
    finally:
        sock.close()
    events = [json.loads(line[6:]) for line in raw.decode(errors="replace").split("\n") if line.startswith("data: {")]
    assert not any("error" in e for e in events), [e for e in events if "error" in e]
    assert events[-1]["usage"]["completion_tokens"] == 600
    assert [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")] == ["length"]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert re.fullmatch(r"x( [a-wyz]{3})*( [a-wyz]{0,3})?", text), text  # cut off at 600 tokens, maybe mid-word
    (line,) = wait_until(lambda: _engine_lines(service, trace), timeout_s=30, what="its engine log line")
    assert line["outcome"] == "finished" and line["generated_tokens"] == 600 and line["pauses"] >= 1
    assert service.wait_idle(timeout_s=30)["admission"]["aside"] == 0


def test_a_connection_that_sends_nothing_is_closed_with_a_408(service):
    sock = _connect(service.base_url)
    sock.settimeout(60)  # a hang guard: had the server not closed it, recv() raises instead of returning b""
    try:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"]["code"] == "client_timeout"


def test_giant_prompts_cost_no_slot_and_a_normal_chat_is_served_beside_them(service, http):
    giant = {"model": MODEL, "messages": [{"role": "user", "content": "lorem ipsum " * 75_000}]}  # ~900 KB

    def send_giant(_: int) -> httpx.Response:
        return httpx.post(f"{service.base_url}/v1/chat/completions", json=giant, headers=service.headers, timeout=60)

    refused_before = service.stats()["admission"]["refused_queue_full"]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        giants = pool.map(send_giant, range(12))  # more than max_ongoing + max_queued (8) at once
        normal = http.post("/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "temperature": 0,
                                                          "max_tokens": 20})
        statuses = [(r.status_code, r.json()["error"]["code"]) for r in giants]
    assert statuses == [(400, "context_length_exceeded")] * 12
    assert normal.status_code == 200 and "Paris" in normal.json()["choices"][0]["message"]["content"]
    assert service.stats()["admission"]["refused_queue_full"] == refused_before  # no giant ever took a slot


def test_a_grammar_the_engine_would_compile_for_minutes_is_refused_and_costs_it_nothing(service, client):
    """3,000 optional literals (15 KB, within the size bounds): the engine would compile it for minutes on a thread
    nothing stops, and the next constrained request would wait behind it until the engine was declared wedged. The
    replica's grammar gate kills that compile at `limits.max_grammar_compile_s` and refuses it with a 400."""
    import openai

    bomb = "root ::= " + " ".join(['"a"?'] * 3000)
    wedged = service.stats()["wedged_total"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8,
                                       extra_body={"structured_outputs": {"grammar": bomb}})
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "structured_outputs", error
    assert "did not compile within 5 s" in error["message"], error
    # The engine never saw it: a constrained request next is answered at once, and no engine was restarted.
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0,
                                            response_format={"type": "json_object"})
    assert answer.choices[0].message.content and answer.choices[0].finish_reason in ("stop", "length")
    assert service.stats()["wedged_total"] == wedged


def test_a_schema_for_outlines_or_one_xgrammar_fails_is_a_400_and_the_replica_stays(service, http):
    """3,000 properties and a patternProperties (86 KB): vLLM's `auto` sent it to outlines, whose check parsed its
    regex with Python's `re` in the replica's process for minutes, until Serve's health check killed the replica.
    One that xgrammar refuses at its compile was a 503 "retry" once the engine had failed it: a 400 with xgrammar's
    words now. A keyword xgrammar lacks but guidance checks (multipleOf) is served, as by `vllm serve`."""
    def chat(schema: dict) -> httpx.Response:
        return http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": QUESTION, "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})

    many = chat({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)},
                 "patternProperties": {"^z": {"type": "string"}}})
    assert many.status_code == 400, many.text
    assert many.json()["error"]["param"] == "response_format" and "outlines" in many.json()["error"]["message"]
    failing = chat({"type": "object", "patternProperties": {"^(a|b){50}x{1,500}$": {"type": "string"}}})
    assert failing.status_code == 400, failing.text
    assert "could not be compiled (xgrammar: Check failed" in failing.json()["error"]["message"], failing.text
    served = chat({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5}}, "required": ["n"]})
    assert served.status_code == 200 and served.json()["choices"][0]["message"]["content"].startswith("{"), served.text
    normal = http.post("/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "max_tokens": 8})
    assert normal.status_code == 200, normal.text

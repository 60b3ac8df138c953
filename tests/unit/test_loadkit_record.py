"""loadkit.record: one per-request record for every client of the kit, its label, and its JSON form read back
(a file of an older version, with fewer fields, included)."""

from __future__ import annotations

import json
from dataclasses import asdict

from loadkit.record import Attempt, Record
from loadkit.workload import Ask


def test_a_record_survives_its_json_form():
    rec = Record(1.0, 3.5, "refused", 429, "queue_full", ask=Ask(7, 100, 32, True, hangup=True, hangup_chunks=2),
                 attempts=[Attempt(429, 0.01, retry_after="2")], chunk_times=[1.5])
    again = Record.from_dict(json.loads(json.dumps(asdict(rec))))
    assert again == rec and again.latency == 2.5


def test_an_older_file_reads_with_defaults():
    old = {"ask": {"index": 1, "prompt_tokens": 50, "max_tokens": 16, "stream": False}, "start": 0.0, "end": 1.0,
           "outcome": "ok", "status": 200, "attempts": [{"status": 200, "seconds": 1.0}], "unknown": "ignored"}
    rec = Record.from_dict(old)
    assert rec.ask == Ask(1, 50, 16, False) and rec.attempts == [Attempt(200, 1.0)] and rec.request_id == ""


def test_the_label_is_the_answer_or_how_it_ended_without_one():
    assert Record(0, status=200).label == "200"
    assert Record(0, status=429, code="over_time_target").label == "429 over_time_target"
    assert Record(0, outcome="hung").label == "hung" and Record(0).label == "?"

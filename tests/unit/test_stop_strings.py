"""Stop strings matched outside the engine (app/engine/stop_strings.py) are vLLM's own rule: the same stop string,
at the same place, for every text and stop list; the text held back is what vLLM holds back."""

from __future__ import annotations

import random

from vllm.v1.engine.detokenizer import check_stop_strings

from app.engine.stop_strings import StopStrings, first_stop


def test_the_stop_found_is_the_one_vllm_finds_for_any_text_and_step():
    rng = random.Random(27)
    for _ in range(3000):
        text = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 14)))
        new = rng.randint(0, len(text))
        stop = tuple({"".join(rng.choice("ab c") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))})
        for include in (False, True):
            theirs = check_stop_strings(text, new, list(stop), include)
            ours = first_stop(text, new, stop) if new else None
            if theirs is None:
                assert ours is None, (text, new, stop)
                continue
            s, at = ours
            assert s == theirs[0], (text, new, stop)
            end = at + len(s) if include else at
            assert (len(text) if theirs[1] == -1 else theirs[1]) == end, (text, new, stop, include)


def test_a_stream_holds_back_what_may_start_a_stop_string_and_cuts_at_the_match():
    stops = StopStrings(("</answer>",), include_in_output=False)
    out = []
    for piece in ["42 is", " it</ans", "wer> and more"]:
        matched = stops.add(piece, 1)
        out.append(stops.release(matched is not None))
    assert out == ["", "42 is", " it"] and matched == "</answer>"  # the 8 characters that may start it waited
    kept = StopStrings(("</answer>",), include_in_output=True)
    assert kept.add("42</answer>!", 1) == "</answer>" and kept.release(True) == "42</answer>"


def test_stop_strings_wait_for_min_tokens():
    stops = StopStrings(("a",), include_in_output=False, min_tokens=2)
    assert stops.add("a", 1) is None and stops.add("b", 1) is None  # tokens 1 and 2 are not checked
    assert stops.add("a", 1) == "a" and stops.release(True) == "ab"

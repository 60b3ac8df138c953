"""Stop strings over one choice's stream of text, exactly as vLLM 0.32's detokenizer applies them.

vLLM (vllm/v1/engine/detokenizer.py) checks the stop strings after each step, once more than `min_tokens`
tokens are out, in the step's new text and the `len(stop) - 1` characters before it; a match ends the
choice with `finish_reason: stop` and the text cut before the stop string (after it with
`include_stop_str_in_output`); when several match in one step the one that ends first wins. While the choice
runs, it holds back the last `max(len(stop)) - 1` characters (none with `include_stop_str_in_output`): they may
be the start of a stop string. A step that ends on a stop token or end-of-sequence is checked too (without
that token's text, which the engine leaves out).

`StopStrings` is that rule on its own, so that the layer holding the client's connection can apply it over a
choice whose tokens came from more than one replica (app/engine/continuation.py), and the fake engine can
stream as vLLM does. Steps of several tokens are checked from the step's first new character (vLLM starts
at the first token past `min_tokens`; the CPU engine makes one token per step).
"""

from __future__ import annotations


def first_stop(text: str, new_chars: int, stop: tuple[str, ...]) -> tuple[str, int] | None:
    """The stop string that ends earliest among those ending in the last `new_chars` characters of `text`
    (ties: the first listed), and where it starts; None when none does."""
    best: tuple[str, int] | None = None
    best_end = len(text) + 1
    for s in stop:
        at = text.find(s, max(0, len(text) - new_chars - len(s) + 1))
        if at != -1 and at + len(s) < best_end:
            best, best_end = (s, at), at + len(s)
    return best


class StopStrings:
    """One choice's text so far, cut at the first stop string (module docstring). `add` each step's text, then
    `release` what the client may be sent now."""

    def __init__(self, stop: tuple[str, ...], include_in_output: bool, min_tokens: int = 0):
        self.stop, self.include, self.min_tokens = stop, include_in_output, min_tokens
        self.hold = max(len(s) for s in stop) - 1 if stop and not include_in_output else 0
        self.text = ""
        self.tokens = 0
        self.sent = 0  # characters of `text` released

    def add(self, text: str, tokens: int) -> str | None:
        """A step's text and token count; returns the stop string it completed (the text is then cut)."""
        self.text += text
        self.tokens += tokens
        if not self.stop or not text or self.tokens <= self.min_tokens:
            return None
        found = first_stop(self.text, len(text), self.stop)
        if found is None:
            return None
        s, at = found
        self.text = self.text[: at + len(s) if self.include else at]
        return s

    def ended_by(self, stop: str) -> None:
        """The engine reports a stop string this matcher did not see end (its own steps may differ): cut it."""
        if not self.include and self.text.endswith(stop):
            self.text = self.text[: len(self.text) - len(stop)]

    def release(self, finished: bool) -> str:
        """The text not yet released that may be now: all of it once the choice has finished."""
        upto = len(self.text) - (0 if finished else self.hold)
        if upto <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : upto], upto
        return out

"""Bounds on vLLM's sampling extensions and the checks that hold a request to them, as vLLM words its own.

vLLM itself has no bounds but `VLLM_MAX_NUM_BAD_WORDS`; each extension costs the engine work per request or per
step, so each is bounded like `stop` (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from app.errors import LONE_SURROGATE, InvalidRequest

MAX_LOGIT_BIAS = 1024  # entries of a logit_bias map
MAX_ALLOWED_TOKEN_IDS = 4096
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's MAX_LOGPROB_TOKEN_IDS: the sampler's row for them is this wide
MAX_BAD_WORDS = 128  # vLLM's VLLM_MAX_NUM_BAD_WORDS, which it counts after tokenizing (a word may count twice)
MAX_BAD_WORD_CHARS = 256
MAX_TOKEN_ID = 2**31 - 1  # above every vocabulary; the engine checks the model's own size
MAX_TOP_K = 2**31 - 1  # vLLM keeps top_k in int32 tensors; any k at or above the vocabulary means "every token"
LOGIT_BIAS_BOUND = 100.0  # biases are clamped to [-100, 100], as vLLM does




def token_ids(name: str, ids: list[int] | None, limit: int) -> tuple[int, ...] | None:
    if ids is None:
        return None
    if len(ids) > limit:
        raise InvalidRequest(f"'{name}' has {len(ids)} token ids; at most {limit} are allowed", param=name)
    return tuple(ids)


def logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    bias = bias or {}
    if len(bias) > MAX_LOGIT_BIAS:
        raise InvalidRequest(
            f"'logit_bias' has {len(bias)} entries; at most {MAX_LOGIT_BIAS} are allowed", param="logit_bias"
        )
    converted: dict[int, float] = {}
    invalid: list[str] = []
    for key, value in bias.items():
        try:
            token_id = int(key)  # as vLLM converts the keys
        except ValueError:
            invalid.append(key)
            continue
        converted[token_id] = min(LOGIT_BIAS_BOUND, max(-LOGIT_BIAS_BOUND, value))
    if invalid:
        raise InvalidRequest(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid[:8]!r}",
            param="logit_bias",
        )
    out_of_range = [t for t in converted if not 0 <= t <= MAX_TOKEN_ID]
    if out_of_range:
        raise InvalidRequest(
            f"token_id(s) {out_of_range[:8]} in logit_bias contain out-of-vocab token ids", param="logit_bias"
        )
    return tuple(converted.items())


def bad_words(words: list[str]) -> tuple[str, ...]:
    if len(words) > MAX_BAD_WORDS:
        raise InvalidRequest(
            f"'bad_words' has {len(words)} entries; at most {MAX_BAD_WORDS} are allowed", param="bad_words"
        )
    for word in words:
        if not word:
            raise InvalidRequest("bad_words cannot contain an empty string", param="bad_words")
        if len(word) > MAX_BAD_WORD_CHARS:
            raise InvalidRequest(
                f"a 'bad_words' entry is {len(word)} characters; at most {MAX_BAD_WORD_CHARS} are allowed",
                param="bad_words",
            )
    text_only("bad_words", words)  # the tokenizer fails on a lone surrogate (JSON can carry one: "\ud800")
    return tuple(dict.fromkeys(words))


MAX_CACHE_SALT_CHARS = 128  # vLLM's bound and forbidden characters (its cache keys are built from the salt)
MAX_REQUEST_ID_CHARS = 128  # as X-Request-Id is cut (http/gate.py): an answer's id is repeated in every chunk
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


def cache_salt(salt: str | None) -> str | None:
    """vLLM's cache_salt, checked by vLLM's rules, in its words."""
    if salt is None:
        return None
    if not salt:
        raise InvalidRequest("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    if len(salt) > MAX_CACHE_SALT_CHARS or any(char in CACHE_SALT_FORBIDDEN for char in salt):
        raise InvalidRequest(f"Parameter 'cache_salt' must be at most {MAX_CACHE_SALT_CHARS} characters and must not "
                             "contain '@', '/', '\\\\', or NUL.", param="cache_salt")
    text_only("cache_salt", (salt,))
    return salt


def text_only(param: str, strings: Iterable[str], named: str = "") -> None:
    """Refuses a string holding a lone UTF-16 surrogate: legal JSON ("\\ud800"), but no UTF-8 encoder (the
    tokenizer, the engine's msgpack, a grammar compiler) takes it, and where one fails unwatched it is a 500."""
    for text in strings:
        if not text.isascii():  # O(1) in CPython: most strings stop here
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidRequest(
                    f"'{named or param}' entries must be valid Unicode text: one holds {LONE_SURROGATE}", param=param
                ) from None

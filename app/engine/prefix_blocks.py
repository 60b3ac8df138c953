"""Prefix-cache blocks as vLLM keys them: a prompt's token ids cut into whole blocks of the engine's block size,
each block named by a hash of its ids chained to the previous block's name, so that one name stands for the whole
prefix up to its block's end. vLLM's cache hits whole blocks only, and never the prompt's last token (it is always
computed): `cacheable_blocks` is how many blocks of a prompt can hit.

`BlockLRU` is a bounded set of block names, least recently used evicted first, as vLLM frees cached blocks. The fake
engine keeps its prefix cache in one; the fleet router (app/routing/) keeps its estimate of each replica's in one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


def block_hashes(token_ids: Sequence[int], block_tokens: int, salt: str | None = None) -> tuple[int, ...]:
    """The chained names of the prompt's whole blocks (a partial last block has none); a `salt` (vLLM's
    cache_salt) goes into the first block's name, as vLLM keys it, and so into every name after."""
    names: list[int] = []
    name = hash(salt) if salt else 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        name = hash((name, tuple(token_ids[start:start + block_tokens])))
        names.append(name)
    return tuple(names)


def cacheable_blocks(prompt_tokens: int, block_tokens: int) -> int:
    """How many of a prompt's blocks its prefix cache can hit: whole blocks short of the last token."""
    return max(0, prompt_tokens - 1) // block_tokens


class BlockLRU:
    """At most `capacity` block names; `match` counts how many of a prompt's leading blocks are held."""

    def __init__(self, capacity: int):
        self.capacity = max(1, capacity)
        self._names: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._names)

    def match(self, names: Sequence[int], touch: bool = False) -> int:
        """Leading names held (a chained name is held only if every block before it is); `touch` marks them used."""
        held = 0
        for name in names:
            if name not in self._names:
                break
            held += 1
        if touch:
            for name in names[:held]:
                self._names.move_to_end(name)
        return held

    def add(self, names: Iterable[int]) -> None:
        """Holds `names` (most recently used last), evicting the least recently used beyond `capacity`."""
        for name in names:
            self._names[name] = None
            self._names.move_to_end(name)
        while len(self._names) > self.capacity:
            self._names.popitem(last=False)

    def forget(self, names: Iterable[int]) -> None:
        for name in names:
            self._names.pop(name, None)

    def forget_through(self, name: int) -> int:
        """Forgets `name` and every name used less recently (an LRU cache that evicted `name` evicted those first);
        returns how many were held."""
        if name not in self._names:
            return 0
        gone = 0
        while self._names:
            oldest, _ = self._names.popitem(last=False)
            gone += 1
            if oldest == name:
                break
        return gone

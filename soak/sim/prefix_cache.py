"""KV blocks with vLLM v1's prefix-caching semantics, in block counts only.

- A prompt's full blocks get chained hashes: block i's hash covers block i's
  tokens and block i-1's hash, so a hit means the whole prefix up to it matches.
- Only full blocks are cached. A lookup stops at the first miss and never
  covers the last prompt token (vLLM recomputes it to get logits), so a
  block-aligned, fully cached prompt hits one block less.
- Usage is referenced blocks / capacity: cached blocks no request holds count
  as free (they sit in the free queue) and are evicted least recently used
  first when a request needs room.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence


def block_hashes(prompt_pieces: Sequence[str], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a prompt given as token pieces."""
    full = len(prompt_pieces) - len(prompt_pieces) % block_size
    return chained_hashes(["".join(prompt_pieces[start : start + block_size]) for start in range(0, full, block_size)])


def text_block_hashes(text: str, bounds: Sequence[int]) -> list[int]:
    """``block_hashes`` of a prompt given as its text and the character offsets
    where its blocks start (``soak.tokens.tokenizer.SectionMemo.cut``)."""
    return chained_hashes([text[a:b] for a, b in zip(bounds, bounds[1:])])


def chained_hashes(blocks: Sequence[str]) -> list[int]:
    out: list[int] = []
    prev = 0
    for block in blocks:
        prev = hash((prev, block))
        out.append(prev)
    return out


@dataclass
class Allocation:
    """The blocks one request holds: shared cached blocks (by hash) plus private ones."""

    cached: list[int] = field(default_factory=list)
    private: int = 0

    @property
    def total(self) -> int:
        return len(self.cached) + self.private


class BlockPool:
    def __init__(self, *, capacity_blocks: int, block_size: int) -> None:
        self.capacity = capacity_blocks
        self.block_size = block_size
        self._refs: dict[int, int] = {}  # cached hash -> requests holding it
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, oldest first
        self._private = 0
        self.evictions = 0

    # ---- accounting
    @property
    def used_blocks(self) -> int:
        """Blocks some request holds (vLLM's usage numerator)."""
        return len(self._refs) - len(self._evictable) + self._private

    @property
    def free_blocks(self) -> int:
        return self.capacity - self.used_blocks

    @property
    def usage(self) -> float:
        return self.used_blocks / self.capacity if self.capacity else 0.0

    def cached_hashes(self) -> int:
        return len(self._refs)

    # ---- lookups
    def lookup(self, hashes: Sequence[int], num_tokens: int) -> int:
        """How many leading blocks are cached (not touching them), capped below the last token."""
        limit = (num_tokens - 1) // self.block_size
        hits = 0
        for h in hashes[:limit]:
            if h not in self._refs:
                break
            hits += 1
        return hits

    def acquire_cached(self, hashes: Sequence[int], alloc: Allocation) -> None:
        for h in hashes:
            refs = self._refs[h]
            if refs == 0:
                del self._evictable[h]
            self._refs[h] = refs + 1
            alloc.cached.append(h)

    def _make_room(self, n: int) -> bool:
        while self.capacity - (len(self._refs) + self._private) < n and self._evictable:
            h, _ = self._evictable.popitem(last=False)
            del self._refs[h]
            self.evictions += 1
        return self.capacity - (len(self._refs) + self._private) >= n

    def grow(self, alloc: Allocation, total_blocks: int) -> bool:
        """Give ``alloc`` at least ``total_blocks`` blocks; False (nothing taken) when full."""
        need = total_blocks - alloc.total
        if need <= 0:
            return True
        if not self._make_room(need):
            return False
        self._private += need
        alloc.private += need
        return True

    def can_grow(self, alloc: Allocation, total_blocks: int) -> bool:
        need = total_blocks - alloc.total
        return need <= 0 or self.capacity - self.used_blocks >= need

    def register(self, alloc: Allocation, block_hash: int) -> None:
        """A private block of ``alloc`` was filled with a full prompt block: cache it."""
        if block_hash in self._refs or alloc.private == 0:
            return  # someone cached the same block first; ours stays private
        alloc.private -= 1
        self._private -= 1
        self._refs[block_hash] = 1
        alloc.cached.append(block_hash)

    def release(self, alloc: Allocation) -> None:
        # vLLM frees a request's blocks tail first, so its later blocks are evicted first
        for h in reversed(alloc.cached):
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._evictable[h] = None
        self._private -= alloc.private
        alloc.cached.clear()
        alloc.private = 0

    def reset(self) -> None:
        self._refs.clear()
        self._evictable.clear()
        self._private = 0

"""What the simulated model says: greedy tokens as a function of the prompt's content.

Each position's distribution is a pure function of one 64-bit *state*: the
prompt's digest (blake2b of its text, so a reference recorded by one simulator
process holds for the next) advanced by every token generated so far. The
chosen (top) token, the runner-up, whether the two are nearly tied and every
logprob follow from the state, so equal prompts give equal answers, different
prompts of equal length different ones, and an answer that carries another
prompt's tokens is recognisable.

- Most positions have a clear winner: the runner-up is ``CLEAR_GAP_MIN`` to
  ``CLEAR_GAP_MAX`` nats below it. A fraction ``near_tie_rate`` are near ties:
  the gap is at most ``TIE_GAP_MAX`` (0.004 nats, inside the oracle's 0.005).
- **Near-tie nondeterminism** (the healthy default, like real vLLM, which is not
  batch-invariant): at a near tie the sampler takes the runner-up with
  probability ``near_tie_flip``, drawn from a hash of the engine step, the
  batch's size and the request's place in it: the batch composition. The
  continuation follows the token taken (the state advances with it).
- **Misalignment** (fault ``corrupt_output``): each request computes its own
  samples, but an affected request *receives* another request's: the next
  emitting request of the batch, or alone in the batch, its own sample from
  ``pp_size`` positions earlier (the seed's broadcast that "pollutes the main
  data stream pp_size steps later"). Its state then advances with what it
  received, and its reported logprobs are the donor context's distribution, so
  the reference token is rarely a near-tie alternative there.

Tokens are the words of ``WORDS``, each one token of ``soak.tokens.tokenizer``
(and so is any run of them), so token counts stay exact. Cheap by design: a
healthy token costs a modulo, a compare and a multiply-xor; logprob lists are
computed only for a request that asked for them (``distribution``).
"""

from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass
from typing import Sequence

# Each is one token of soak.tokens.tokenizer, and so is each of them after another.
WORDS = tuple(
    " " + w
    for w in (
        "the of and to in is that it for was on are as with his they at be this "
        "from have or by one had not but what all were when we there can an your "
        "which their said if do will each about how up out them then she many some "
        "so these would other into has more her two like him see time could no make "
        "than been call who its now find long down day did get come made may part"
    ).split()
    if len(w) <= 4
)
NW = len(WORDS)
# 76 = 4 * 19: an odd stride that is no multiple of 19 walks every word once.
_STRIDES = (1, 3, 5, 7, 9, 11, 13, 15, 17, 21, 23, 25)
assert NW == 76, "the strides above are coprime with 76"

M64 = (1 << 64) - 1
_K1 = 0x9E3779B97F4A7C15
_K2 = 0xBF58476D1CE4E5B9
TIE_BITS = 20  # the near-tie draw reads bits 12..31 of the state
TIE_GAP_MAX = 0.004
CLEAR_GAP_MIN, CLEAR_GAP_MAX = 1.0, 4.0
MAX_TOP_LOGPROBS = 20


_WHOLE_HASH_BYTES = 1 << 16


def prompt_digest(text: str) -> int:
    """The state before the first token: the prompt's content, stable across processes.

    A long prompt (a 230K-token agent turn is about 1 MB) is read through CRC-32
    and Adler-32 (15x cheaper than blake2b: a turn costs ~0.3 ms, not 4) plus its
    length and both ends, mixed by blake2b; CRC-32 misses no change of up to 32
    bits, so two prompts that differ anywhere still answer differently."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > _WHOLE_HASH_BYTES:
        data = b"".join((zlib.crc32(data).to_bytes(4, "little"), zlib.adler32(data).to_bytes(4, "little"),
                         len(data).to_bytes(8, "little"), data[:4096], data[-4096:]))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def advance(state: int, token: int) -> int:
    """The state after ``token``: a multiply-xor mix (splitmix64's finaliser, halved)."""
    x = ((state ^ (((token + 1) * _K1) & M64)) * _K2) & M64
    return x ^ (x >> 29)


_TOKEN_MIX = tuple(((t + 1) * _K1) & M64 for t in range(NW))  # advance's per-token term, precomputed


def tie_threshold(rate: float) -> int:
    return int(rate * (1 << TIE_BITS))


def is_tie(state: int, threshold: int) -> bool:
    return ((state >> 12) & ((1 << TIE_BITS) - 1)) < threshold


def top_of(state: int) -> int:
    return state % NW


def runner_up(state: int) -> int:
    return (state % NW + 1 + (state >> 40) % (NW - 1)) % NW


def flip_draw(step: int, batch: int, index: int, offset: int) -> float:
    """A uniform draw in [0, 1) from the batch composition (step, batch size, place)."""
    x = advance(advance((step * 0x100000001B3) & M64, batch), index * 64 + offset)
    return (x >> 11) / float(1 << 53)


def distribution(state: int, k: int, threshold: int) -> list[tuple[int, float]]:
    """The top ``max(k, 2)`` tokens at ``state`` (word index, logprob), best first.

    Logits: the top 0, the runner-up ``-gap``, the rest half a nat apart below
    it, plus the unlisted vocabulary's mass; normalised, so the logprobs are a
    sub-distribution and the top-vs-runner-up gap is exactly ``gap``."""
    top, second = top_of(state), runner_up(state)
    frac = ((state >> 32) & 0xFF) / 255.0
    gap = frac * TIE_GAP_MAX if is_tie(state, threshold) else CLEAR_GAP_MIN + frac * (CLEAR_GAP_MAX - CLEAR_GAP_MIN)
    n = max(2, min(k, MAX_TOP_LOGPROBS))
    stride = _STRIDES[(state >> 48) % len(_STRIDES)]
    tokens, logits = [top, second], [0.0, -gap]
    w = second
    while len(tokens) < MAX_TOP_LOGPROBS:
        w = (w + stride) % NW
        if w != top:
            tokens.append(w)
            logits.append(-gap - 1.0 - 0.5 * (len(tokens) - 3))
    rest = math.exp(-gap - 12.0) * (NW - MAX_TOP_LOGPROBS)
    z = math.log(sum(math.exp(v) for v in logits) + rest)
    return [(t, v - z) for t, v in zip(tokens[:n], logits[:n])]


def logprob_of(token: int, dist: Sequence[tuple[int, float]], state: int, threshold: int) -> float:
    """``token``'s logprob at ``state`` (looked up past the listed ``dist`` when needed)."""
    for t, lp in dist:
        if t == token:
            return lp
    for t, lp in distribution(state, MAX_TOP_LOGPROBS, threshold):
        if t == token:
            return lp
    return distribution(state, MAX_TOP_LOGPROBS, threshold)[-1][1] - 1.0


@dataclass(frozen=True)
class Misalignment:
    """Fault ``corrupt_output``'s reach: which answers receive other samples."""

    long_only: bool = False
    long_tokens: int = 2048
    one_in: int = 1
    seed: int = 0

    def affects(self, number: int, prompt_tokens: int) -> bool:
        if self.long_only and prompt_tokens < self.long_tokens:
            return False
        return self.one_in <= 1 or advance(self.seed & M64, number) % self.one_in == 0


_TIE_MASK = (1 << TIE_BITS) - 1


def sample_batch(step: int, batch_size: int, emitting: Sequence[tuple[object, int]], *, threshold: int,
                 flip: float, misalign: Misalignment | None, pp: int) -> None:
    """Append each emitting request's ``n`` new tokens (``req.tokens``, and the
    reported states to ``req.dists`` where logprobs were asked); advance its state.

    ``emitting``: (request, tokens emitted this step) in batch order. The healthy
    path is inlined: it runs for every token the simulator serves."""
    if misalign is None:
        if flip <= 0.0:
            threshold = 0  # batch-invariant: no tie ever flips, so none is looked for
        mix, mask = _TOKEN_MIX, _TIE_MASK
        for j, (req, n) in enumerate(emitting):
            s = req.state  # type: ignore[attr-defined]
            append = req.tokens.append  # type: ignore[attr-defined]
            dists = req.dists  # type: ignore[attr-defined]
            for t in range(n):
                tok = s % 76
                if ((s >> 12) & mask) < threshold and flip_draw(step, batch_size, j, t) < flip:
                    tok = runner_up(s)
                if dists is not None:
                    dists.append(s)
                append(tok)
                s = ((s ^ mix[tok]) * _K2) & M64
                s ^= s >> 29
            req.state = s  # type: ignore[attr-defined]
        return
    samples = [_own_samples(req, n, step, batch_size, j, threshold, flip) for j, (req, n) in enumerate(emitting)]
    m = len(emitting)
    for j, (req, n) in enumerate(emitting):
        mine = samples[j]
        got = mine
        if misalign.affects(req.number, req.prompt_tokens):  # type: ignore[attr-defined]
            delayed = _delayed(req, mine, pp)  # kept every step: the request may be alone in a later one
            if m > 1:  # the next request's samples reach this one
                donor = samples[(j + 1) % m]
                got = [donor[t] if t < len(donor) else mine[t] for t in range(n)]
            else:  # alone: its own sample from pp positions back
                got = delayed
        s = req.state  # type: ignore[attr-defined]
        for tok, dist in got:
            if req.dists is not None:  # type: ignore[attr-defined]
                req.dists.append(dist)  # type: ignore[attr-defined]
            req.tokens.append(tok)  # type: ignore[attr-defined]
            s = advance(s, tok)
        req.state = s  # type: ignore[attr-defined]


def _own_samples(req, n: int, step: int, batch_size: int, j: int, threshold: int, flip: float) -> list[tuple[int, int]]:
    """What this request's own context samples for its next ``n`` positions: (token, state)."""
    s = req.state
    out = []
    for t in range(n):
        tok = top_of(s)
        if is_tie(s, threshold) and flip > 0.0 and flip_draw(step, batch_size, j, t) < flip:
            tok = runner_up(s)
        out.append((tok, s))
        s = advance(s, tok)
    return out


def _delayed(req, mine: list[tuple[int, int]], pp: int) -> list[tuple[int, int]]:
    if req.history is None:
        req.history, req.history_from = [], len(req.tokens)
    base = len(req.tokens) - req.history_from
    req.history.extend(mine)  # first: with pp 1 a position may receive this step's own earlier sample
    return [req.history[base + t - pp] if base + t - pp >= 0 else own for t, own in enumerate(mine)]

"""A gzip sample segment inflates to at most ``Limits.inflated_bytes``: for any
gzip stream, the bounded reader gives back exactly what it holds when that
fits and raises ``BoundExceeded(inflated_bytes)`` past it, having inflated no
more than the bound (a 4 MB file of zeros inflates to gigabytes); in a run
directory that segment counts as bad and the others are still read."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.bounds import LIMITS, Bound, BoundExceeded, open_gzip_input
from soak.store.segments import iter_sample_lines


@settings(max_examples=150, deadline=None)
@given(size=st.integers(0, 1 << 18), limit=st.integers(1, 1 << 18), pattern=st.binary(min_size=1, max_size=40),
       chunk=st.sampled_from([1, 7, 4096, 1 << 16, -1]))
def test_a_gzip_stream_reads_whole_within_the_cap_and_is_refused_past_it(tmp_path_factory, size, limit, pattern,
                                                                         chunk) -> None:
    data = (pattern * (size // len(pattern) + 1))[:size]
    path = tmp_path_factory.mktemp("gz") / "samples-000.jsonl.gz"
    path.write_bytes(gzip.compress(data, compresslevel=1))
    with open_gzip_input(path, limit=limit) as handle:
        got = bytearray()
        try:
            while True:
                piece = handle.read(chunk)
                if not piece:
                    break
                got += piece
        except BoundExceeded as exc:
            assert size > limit and exc.bound is Bound.INFLATED_BYTES and exc.limit == limit
            assert len(got) <= limit and data.startswith(bytes(got))
            assert handle.raw.produced <= limit + 1  # inflated no more than the bound
        else:
            assert size <= limit and bytes(got) == data


def test_a_segment_inflating_past_the_cap_is_a_bad_segment_and_the_rest_is_read(tmp_path) -> None:
    line = b'{"kind":"gpu","ts":1,"pad":"' + b"0" * (1 << 20) + b'"}\n'
    count = LIMITS.inflated_bytes // len(line) + 4
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(tmp_path / "samples-000.jsonl.gz", "wb") as fh:
        for _ in range(count):
            fh.write(compressor.compress(line))
        fh.write(compressor.flush())
    assert (tmp_path / "samples-000.jsonl.gz").stat().st_size < 4 << 20
    (tmp_path / "samples-001.jsonl.gz").write_bytes(gzip.compress(b'{"kind":"gpu","ts":2}\n'))
    (tmp_path / "samples.jsonl").write_bytes(b'{"kind":"gpu","ts":3}\n')
    stats: dict = {}
    seen = [(path.name, raw) for path, _, raw in iter_sample_lines(tmp_path, stats=stats)]
    assert stats == {"bad_segments": 1}
    from_bomb = [raw for name, raw in seen if name == "samples-000.jsonl.gz"]
    assert 0 < len(from_bomb) * len(line) <= LIMITS.inflated_bytes
    assert seen[-2:] == [("samples-001.jsonl.gz", b'{"kind":"gpu","ts":2}\n'),
                         ("samples.jsonl", b'{"kind":"gpu","ts":3}\n')]

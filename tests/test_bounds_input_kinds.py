"""Readers never wait on what is not a file (soak.bounds.open_input): for any
path a reader is given that is a FIFO with no writer, a directory, a socket or
a terminal (a device with nothing to read), every reader of configs, run
directories and dumps raises an ``OSError`` (``NotRegularFile``, also
``InputRejected``, for what it opened) within a second, never blocks. Each
reader runs in a thread joined with a timeout, so a regression fails here
instead of hanging the suite (the FIFO is then opened for writing, releasing it)."""

from __future__ import annotations

import gzip
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.bounds import BoundExceeded, InputRejected, NotRegularFile, open_gzip_input, open_input, read_file, read_json_file
from soak.flightrec.dumps import FlightRecorderError, read_dump_bytes
from soak.jsonl import read_json, read_jsonl
from soak.store.segments import iter_sample_lines

GUARD_S = 10.0


def guarded(fn, *, release: Path | None = None):
    """``fn()``'s result or exception, failing the test if it takes more than GUARD_S."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(GUARD_S)
    if thread.is_alive():
        if release is not None:  # let the blocked open() go on, so the thread ends
            try:
                os.close(os.open(release, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"reader still blocked after {GUARD_S:g}s on {release}")
    return box, time.monotonic() - started


def make_kind(kind: str, path: Path, keep: list) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        keep.append(sock)
    elif kind == "terminal":
        master, slave = os.openpty()
        keep.extend([master, slave])
        os.symlink(os.ttyname(slave), path)
    else:
        raise AssertionError(kind)


def _list(it):
    return list(it)


READERS = {
    "read_file": lambda p: read_file(p),
    "read_json_file": lambda p: read_json_file(p),
    "read_jsonl": lambda p: _list(read_jsonl(p)),
    "open_input": lambda p: open_input(p).read(10),
    "open_gzip_input": lambda p: open_gzip_input(p).read(10),
    "read_dump_bytes": lambda p: read_dump_bytes(p),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["fifo", "directory", "socket", "terminal"]), reader=st.sampled_from(sorted(READERS)),
       name=st.sampled_from(["config.yaml", "samples-001.jsonl", "incident.json", "nccl_trace_rank_0", "bisect.json"]))
def test_any_reader_refuses_what_is_not_a_file_without_waiting(kind, reader, name) -> None:
    keep: list = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        make_kind(kind, path, keep)
        try:
            box, took = guarded(lambda: READERS[reader](path), release=path if kind == "fifo" else None)
        finally:
            for k in keep:
                k.close() if isinstance(k, socket.socket) else os.close(k)
    assert "error" in box, f"{reader} read {kind} {name}: {box.get('value')!r}"
    error = box["error"]
    if reader == "read_dump_bytes":
        assert isinstance(error, FlightRecorderError) and str(path) in str(error)
    else:
        assert isinstance(error, OSError), repr(error)
        if kind != "socket":  # a socket cannot even be opened: ENXIO from open itself
            assert isinstance(error, NotRegularFile) and isinstance(error, InputRejected)
            assert str(path) in str(error) and "not a regular file" in str(error)
    assert took < GUARD_S


@pytest.mark.parametrize("kind", ["fifo", "directory", "terminal"])
def test_a_run_directory_reader_passes_over_what_is_not_a_file(tmp_path, kind) -> None:
    keep: list = []
    make_kind(kind, tmp_path / "samples-001.jsonl", keep)
    make_kind(kind, tmp_path / "summary.json", keep) if kind != "terminal" else None
    (tmp_path / "samples.jsonl").write_bytes(b'{"kind":"gpu","ts":1}\n')
    stats: dict = {}
    box, _ = guarded(lambda: [raw for _, _, raw in iter_sample_lines(tmp_path, stats=stats)],
                     release=tmp_path / "samples-001.jsonl" if kind == "fifo" else None)
    assert box.get("value") == [b'{"kind":"gpu","ts":1}\n'] and stats == {"bad_segments": 1}
    box, _ = guarded(lambda: read_json(tmp_path / "summary.json"),
                     release=tmp_path / "summary.json" if kind == "fifo" else None)
    assert box == {"value": None}
    for k in keep:
        os.close(k)


def test_a_character_device_reads_bounded_where_allowed_and_is_refused_in_a_run_directory(tmp_path) -> None:
    with pytest.raises(BoundExceeded):
        read_file("/dev/zero", limit=1 << 16)
    with pytest.raises(NotRegularFile, match="character device"):
        read_file("/dev/zero", devices=False)
    os.symlink("/dev/zero", tmp_path / "samples-001.jsonl.gz")
    stats: dict = {}
    assert list(iter_sample_lines(tmp_path, stats=stats)) == [] and stats == {"bad_segments": 1}


def test_regular_files_read_as_before(tmp_path) -> None:
    (tmp_path / "a.json").write_text('{"a": [1, 2.5]}')
    assert read_json_file(tmp_path / "a.json") == {"a": [1, 2.5]}
    (tmp_path / "b.gz").write_bytes(gzip.compress(b"x\ny\n"))
    with open_gzip_input(tmp_path / "b.gz") as handle:
        assert handle.read() == b"x\ny\n"

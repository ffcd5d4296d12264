"""ReadAhead: bounded read-ahead, errors in order and sticky, and a thread that always ends."""

import gc
import io
import threading
import time

import pytest

from corpus_assets.core.ingest.read_ahead import ReadAhead

BLOCK = 1 << 16


class Counting:
    """A source of ``total`` numbered blocks that records how many were read, then maybe fails."""

    def __init__(self, total: int, error: Exception | None = None) -> None:
        self.total = total
        self.error = error
        self.calls = 0

    def read_block(self) -> bytes:
        if self.calls == self.total:
            if self.error is not None:
                raise self.error
            return b""
        self.calls += 1
        return bytes([self.calls % 256]) * BLOCK


def read_ahead_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "read-ahead"]


def wait_until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_hands_out_every_block_in_order_and_ends() -> None:
    source = Counting(40)
    with io.BufferedReader(ReadAhead(source, batch_bytes=3 * BLOCK)) as reader:
        data = reader.read()
    assert data == b"".join(bytes([n % 256]) * BLOCK for n in range(1, 41))


def test_reads_at_most_depth_batches_ahead_of_a_stalled_consumer() -> None:
    source = Counting(1000)
    reader = ReadAhead(source, batch_bytes=4 * BLOCK, depth=2)
    try:
        # the queue full (depth batches) and a third batch read, waiting to be put: stalled
        wait_until(lambda: source.calls >= 3 * 4, "the helper never filled its queue")
        # depth queued batches + one being filled + one waiting to be put, of 4 blocks each
        assert source.calls <= 4 * 4
        assert reader.readinto(bytearray(BLOCK)) == BLOCK
    finally:
        reader.close()
    assert not read_ahead_threads()


def test_an_error_comes_after_the_blocks_before_it_and_stays_raised() -> None:
    source = Counting(5, error=ValueError("broken at block 6"))
    reader = ReadAhead(source, batch_bytes=2 * BLOCK)
    buffer = bytearray(BLOCK)
    for _ in range(5):
        assert reader.readinto(buffer) == BLOCK
    for _ in range(2):
        with pytest.raises(ValueError, match="broken at block 6"):
            reader.readinto(buffer)
    reader.close()


def test_close_stops_the_thread_before_returning_so_the_source_may_be_closed() -> None:
    source = Counting(10_000)
    reader = ReadAhead(source, batch_bytes=BLOCK, depth=1)
    reader.readinto(bytearray(BLOCK))
    reader.close()
    assert not read_ahead_threads()
    calls = source.calls
    assert not read_ahead_threads() and source.calls == calls  # nothing read after close


def test_an_abandoned_reader_is_collected_and_its_thread_ends() -> None:
    source = Counting(10_000)
    reader = ReadAhead(source, batch_bytes=BLOCK, depth=1)
    reader.readinto(bytearray(BLOCK))
    del reader
    gc.collect()
    wait_until(lambda: not read_ahead_threads(), "the read-ahead thread outlived its reader")

import gzip
import io
import random
import struct
import time
import tracemalloc

import pytest
import zstandard

from corpus_assets.core.ingest.codecs import (
    CodecError,
    DecompressionBombError,
    DecompressionLimits,
    TruncatedStreamError,
    iter_lines,
    iter_located_lines,
    open_decompressed,
    sniff_codec,
)
from corpus_assets.core.storage.cas import ContentStore

LINES = [b'{"id": %d, "text": "line %d"}' % (i, i * 7) for i in range(20_000)]
JSONL = b"\n".join(LINES) + b"\n"


def zstd_frames(*parts: bytes) -> bytes:
    return b"".join(zstandard.ZstdCompressor(write_checksum=True).compress(p) for p in parts)


READ_AHEAD = {"on": False}


@pytest.fixture(autouse=True, params=[False, True], ids=["inline", "read_ahead"])
def read_ahead(request: pytest.FixtureRequest) -> bool:
    """Every test runs with the decoder in the caller's thread and on a read-ahead thread."""
    READ_AHEAD["on"] = request.param
    return bool(request.param)


def read_all(stream: io.BufferedIOBase, what: str, **kwargs: object) -> bytes:
    with open_decompressed(
        stream,  # type: ignore[arg-type]
        what,
        read_ahead=READ_AHEAD["on"],
        **kwargs,  # type: ignore[arg-type]
    ) as reader:
        return reader.read()


def test_sniff_codec() -> None:
    assert sniff_codec(zstandard.ZstdCompressor().compress(b"x")[:4]) == "zstd"
    assert sniff_codec(gzip.compress(b"x")[:4]) == "gzip"
    assert sniff_codec(b'{"a"') == "plain"
    assert sniff_codec(b"") == "plain"
    assert sniff_codec(b"\x28\xb5") == "plain"  # too short to be a zstd frame


@pytest.mark.parametrize(
    "encode",
    [
        pytest.param(lambda data: data, id="plain"),
        pytest.param(lambda data: zstd_frames(data), id="zstd"),
        pytest.param(lambda data: gzip.compress(data), id="gzip"),
    ],
)
def test_round_trip_through_every_codec(encode) -> None:  # type: ignore[no-untyped-def]
    assert read_all(io.BytesIO(encode(JSONL)), "obj") == JSONL
    assert [line for _, line in iter_lines(io.BytesIO(encode(JSONL)), "obj")] == LINES


def test_multi_frame_zstd_and_skippable_frames() -> None:
    third = len(JSONL) // 3
    skippable = struct.pack("<II", 0x184D2A50, 5) + b"notes"
    payload = (
        zstd_frames(JSONL[:third])
        + skippable
        + zstd_frames(JSONL[third : 2 * third], JSONL[2 * third :])
    )
    assert read_all(io.BytesIO(payload), "multi.zst") == JSONL
    numbered = list(iter_lines(io.BytesIO(payload), "multi.zst"))
    assert numbered[0] == (1, LINES[0])
    assert numbered[-1] == (len(LINES), LINES[-1])


def test_multi_member_gzip() -> None:
    half = len(JSONL) // 2
    payload = gzip.compress(JSONL[:half]) + gzip.compress(JSONL[half:])
    assert read_all(io.BytesIO(payload), "multi.gz") == JSONL


def test_truncated_zstd_raises_naming_the_object_at_every_cut() -> None:
    first = zstd_frames(JSONL[:50_000])
    payload = first + zstd_frames(JSONL[50_000:])
    frame_end = len(first)
    cuts = [4, 5, 9, 100, frame_end - 1, frame_end + 4, frame_end + 50, len(payload) - 4]
    cuts += [len(payload) - 1, len(payload) // 2]
    for cut in cuts:
        with pytest.raises(TruncatedStreamError, match=r"shard-7\.jsonl\.zst"):
            read_all(io.BytesIO(payload[:cut]), "shard-7.jsonl.zst")
        with pytest.raises(TruncatedStreamError, match=r"shard-7\.jsonl\.zst.*after line"):
            list(iter_lines(io.BytesIO(payload[:cut]), "shard-7.jsonl.zst"))


def test_zstandard_stream_reader_alone_would_miss_the_truncation() -> None:
    """Why the decoder exists: the library's reader reports a clean EOF on a cut frame."""
    payload = zstd_frames(JSONL)
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload[:-10]))
    assert len(reader.read()) < len(JSONL)  # no exception


def test_truncated_gzip_raises_naming_the_object_at_every_cut() -> None:
    member = gzip.compress(JSONL[:50_000])
    payload = member + gzip.compress(JSONL[50_000:])
    cuts = [2, 5, 10, 60, len(member) - 1, len(member) + 3, len(payload) // 2, len(payload) - 8]
    cuts.append(len(payload) - 1)
    for cut in cuts:
        with pytest.raises(TruncatedStreamError, match=r"shard-7\.jsonl\.gz"):
            read_all(io.BytesIO(payload[:cut]), "shard-7.jsonl.gz")


def test_corrupt_zstd_raises_codec_error_naming_the_object() -> None:
    payload = bytearray(zstd_frames(JSONL))
    payload[len(payload) // 2] ^= 0xFF
    with pytest.raises(CodecError, match=r"bad\.zst"):
        read_all(io.BytesIO(bytes(payload)), "bad.zst")
    with pytest.raises(CodecError, match=r"trailing\.zst"):
        read_all(io.BytesIO(zstd_frames(b"ok\n") + b"garbage!"), "trailing.zst")


def test_errors_stay_raised_on_a_second_read(read_ahead: bool) -> None:
    reader = open_decompressed(
        io.BytesIO(zstd_frames(JSONL)[:-3]), "again.zst", read_ahead=read_ahead
    )
    with pytest.raises(TruncatedStreamError):
        reader.read()
    with pytest.raises(TruncatedStreamError):
        reader.read()


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_bomb_is_stopped_early_with_bounded_memory(codec: str) -> None:
    zeros = b"\0" * (200 << 20)
    if codec == "zstd":
        bomb = zstandard.ZstdCompressor(level=3).compress(zeros)
    else:
        bomb = gzip.compress(zeros, compresslevel=6)
    del zeros
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(DecompressionBombError, match=r"bomb\.bin") as raised:
            read_all(io.BytesIO(bomb), "bomb.bin", limits=DecompressionLimits(max_ratio=100))
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "max_ratio=100" in str(raised.value)
    assert elapsed < 2.0
    assert peak < 64 << 20  # never near the 200 MB the bomb would expand to


def test_output_size_limit_names_limit_and_counts() -> None:
    payload = zstd_frames(JSONL)
    limits = DecompressionLimits(max_output_bytes=100_000)
    with pytest.raises(DecompressionBombError) as raised:
        read_all(io.BytesIO(payload), "big.zst", limits=limits)
    message = str(raised.value)
    assert "big.zst" in message and "max_output_bytes=100000" in message
    assert "compressed" in message


def test_small_highly_compressible_file_passes_the_ratio_floor() -> None:
    zeros = b"\0" * (4 << 20)  # ratio far above 1000, but below the 16 MiB floor
    assert read_all(io.BytesIO(zstd_frames(zeros)), "zeros.zst") == zeros


def test_plain_streams_pass_through_without_limits() -> None:
    data = b"a\n" * 100_000
    limits = DecompressionLimits(max_output_bytes=10)
    assert read_all(io.BytesIO(data), "plain.txt", limits=limits) == data


def test_crlf_and_last_line_without_newline() -> None:
    data = b"one\r\ntwo\n\r\n\nfive\r\r\nlast"
    assert list(iter_lines(io.BytesIO(data), "crlf.txt")) == [
        (1, b"one"),
        (2, b"two"),
        (3, b""),
        (4, b""),
        (5, b"five\r"),
        (6, b"last"),
    ]
    assert list(iter_lines(io.BytesIO(zstd_frames(b"a\r\nb")), "crlf.zst")) == [
        (1, b"a"),
        (2, b"b"),
    ]
    assert list(iter_lines(io.BytesIO(b""), "empty")) == []
    assert list(iter_lines(io.BytesIO(b"x\n"), "one")) == [(1, b"x")]


def test_over_long_line_names_the_line() -> None:
    data = b"short\n" + b"x" * 5000 + b"\nafter\n"
    with pytest.raises(CodecError, match=r"long\.jsonl: line 2 is longer than 1000 bytes"):
        list(iter_lines(io.BytesIO(data), "long.jsonl", max_line_bytes=1000))
    exact = b"y" * 1000 + b"\n"
    assert list(iter_lines(io.BytesIO(exact), "exact", max_line_bytes=1000)) == [(1, b"y" * 1000)]


def test_reads_a_cas_object_and_keeps_its_integrity_check(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cas = ContentStore(tmp_path / "cas")
    digest = cas.put_bytes(zstd_frames(JSONL))
    with cas.open(digest, "shard") as stream:
        assert sum(1 for _ in iter_lines(stream, "shard")) == len(LINES)
    path = cas.path(digest)
    path.chmod(0o644)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01  # flips the checksum: zstd or the CAS must refuse it
    path.write_bytes(bytes(raw))
    with cas.open(digest, "shard") as stream, pytest.raises(RuntimeError, match="shard"):
        list(iter_lines(stream, "shard"))


def frames_of_every_block_kind() -> list[bytes]:
    """Frames holding raw, RLE and compressed blocks, with and without checksum or content size."""
    noise = bytes(random.Random(7).randbytes(300))  # incompressible: a raw block
    return [
        zstandard.ZstdCompressor(write_checksum=True).compress(noise),
        zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * 200_000),  # RLE
        zstandard.ZstdCompressor(write_checksum=True).compress(JSONL[:2000]),
        struct.pack("<II", 0x184D2A5F, 3) + b"abc",  # a skippable frame
    ]


def test_every_cut_off_a_frame_boundary_is_truncated_and_every_boundary_is_not() -> None:
    """The frame walker must agree with zstd byte for byte: at every cut of a multi-frame
    stream, a prefix ending on a frame boundary decodes, any other prefix is truncated."""
    frames = frames_of_every_block_kind()
    payload = b"".join(frames)
    boundaries = {sum(len(frame) for frame in frames[:count]) for count in range(1, 5)}
    decoder = zstandard.ZstdDecompressor()
    for cut in range(4, len(payload) + 1):
        prefix = payload[:cut]
        if cut in boundaries:
            expected = decoder.stream_reader(io.BytesIO(prefix), read_across_frames=True).read()
            assert read_all(io.BytesIO(prefix), "cut.zst") == expected
        else:
            with pytest.raises(TruncatedStreamError, match=rf"cut\.zst.*after {cut} compressed"):
                read_all(io.BytesIO(prefix), "cut.zst")


def test_a_reserved_block_type_is_corrupt_data_naming_the_object() -> None:
    frame = bytearray(zstandard.ZstdCompressor().compress(JSONL[:5000]))
    header = zstandard.frame_header_size(bytes(frame))
    frame[header] |= 0b110  # block type 3 is reserved
    with pytest.raises(CodecError, match=r"reserved\.zst: corrupt zstd data"):
        read_all(io.BytesIO(bytes(frame)), "reserved.zst")


def test_the_limits_hold_even_for_one_huge_read(read_ahead: bool) -> None:
    """A caller asking for everything at once must not get past the output cap in one call."""
    payload = zstd_frames(b"\0" * (40 << 20))
    reader = open_decompressed(
        io.BytesIO(payload),
        "huge.zst",
        DecompressionLimits(max_output_bytes=3 << 20),
        read_ahead=read_ahead,
    )
    with pytest.raises(DecompressionBombError, match=r"huge\.zst"):
        reader.read(40 << 20)
    decoded = reader.raw.source if read_ahead else reader.raw
    assert decoded.produced <= (4 << 20)  # stopped within one 1 MiB step past the cap


def reference_lines(data: bytes) -> list[tuple[int, int, bytes]]:
    """What iter_located_lines must yield, computed over the whole data at once."""
    parts = data.split(b"\n")
    last = parts.pop()
    located, offset = [], 0
    for number, part in enumerate(parts, 1):
        located.append((number, offset, part[:-1] if part.endswith(b"\r") else part))
        offset += len(part) + 1
    if last:
        located.append((len(parts) + 1, offset, last))
    return located


def random_lines(rng: random.Random, count: int, endings: list[bytes]) -> bytes:
    return b"".join(
        rng.randbytes(rng.randint(0, 3000)).replace(b"\n", b"").replace(b"\r", b"")
        + rng.choice(endings)
        for _ in range(count)
    )


@pytest.mark.parametrize("compressed", [False, True])
def test_lines_and_offsets_across_block_boundaries(compressed: bool) -> None:
    """Lines straddling the 1 MiB decoded blocks, a CRLF cut between two blocks (no other CR in
    the second), empty lines, a last line without newline."""
    rng = random.Random(11)
    head = random_lines(rng, 1000, [b"\n", b"\r\n", b"\r\r\n", b"\n\n"])[: 1 << 20]
    head = head[:-1] + b"\r"  # a zstd block of 1 MiB decoded ends on this CR
    tail = random_lines(rng, 1000, [b"\n", b"\n\n"]) + b"no newline at the end"
    data = head + b"\n" + tail
    payload = zstd_frames(data) if compressed else data
    located = list(iter_located_lines(io.BytesIO(payload), "blocks", max_line_bytes=1 << 20))
    assert located == reference_lines(data)


def test_an_over_long_line_across_blocks_is_raised_after_the_lines_before_it() -> None:
    data = b"first\r\nsecond\n" + b"z" * (3 << 20) + b"\nnever\n"
    seen = []
    with pytest.raises(CodecError, match=r"huge\.jsonl: line 3 is longer than 2097152 bytes"):
        for item in iter_located_lines(io.BytesIO(data), "huge.jsonl", max_line_bytes=2 << 20):
            seen.append(item)
    assert seen == [(1, 0, b"first"), (2, 7, b"second")]

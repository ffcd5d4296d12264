"""Which records realise a mixing plan, and in which order (pure numpy and Arrow; no workspace).

The selection key of a record in pass ``r`` of source ``s`` under mix seed ``m`` is, in unsigned
64-bit arithmetic (multiplication modulo 2**64)::

    h   = the record content digest's 64 sha256 hex digits (its last 64 characters, so a
          ``sha256:`` prefix is allowed); D = int(h[:16], 16), the digest's first 64 bits
    K   = int.from_bytes(sha256(f"{m}\\x00{s}\\x00{r}".encode()).digest()[:8], "big")
    key = fmix64(D ^ K)
    fmix64(z): z ^= z >> 33; z *= 0xff51afd7ed558ccd; z ^= z >> 33;
               z *= 0xc4ceb9fe1a85ec53; z ^= z >> 33        (MurmurHash3's bijective finaliser)

It is a keyed function of (seed, source, record content, pass) only - never the snapshot, other
sources or the worker count - so appending records to one source changes no other source's
selection. D is already uniform (a sha256 prefix); the per-pass key K and the finaliser give each
pass its own order. Everything is computed over whole numpy arrays; no Python loop per record.

Pass r of a source ranks its records by (key, record_id): whole passes while they fit the plan,
then the first k (documents: bottom-k) or the shortest prefix whose tokens reach the plan
(tokens: the source overshoots by less than one document). The stream is every selected
(record, pass) ordered by (key, record_id, pass) across sources.
"""

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.training_view.mixing.plan import MixingError, SourcePlan, decimal_text

log = logging.getLogger(__name__)

_FMIX_MULTIPLIERS = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))
_SHIFT = np.uint64(33)
_NOT_HEX = np.uint8(255)
_HEX_VALUE = np.full(256, _NOT_HEX, dtype=np.uint8)
_HEX_VALUE[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX_VALUE[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)
_PARSE_BATCH = 1 << 20  # digests parsed at a time: bounds the temporaries to ~40 MB


@dataclass(frozen=True)
class Members:
    """One source's train records, sorted by record_id: ids, content digests, token counts.

    A reader that parsed the digests a batch at a time passes their ``bits`` instead (and no
    digests): the 64-hex strings are the largest per-record column."""

    record_id: pa.Array
    record_digest: pa.Array | None
    tokens: np.ndarray
    bits: np.ndarray | None = None

    def digest_bits(self) -> np.ndarray:
        """D of every member (``digest_bits``)."""
        if self.bits is not None:
            return self.bits
        if self.record_digest is None:
            raise ValueError("Members need record_digest or its bits")
        return digest_bits(self.record_digest)


@dataclass(frozen=True)
class Selection:
    """One source's chosen (record, pass) pairs: ``whole`` full passes over all its
    ``population`` records, then ``rows`` (indices into its members) of pass number ``whole``."""

    whole: int
    rows: np.ndarray
    population: int

    @property
    def docs(self) -> int:
        return self.whole * self.population + len(self.rows)

    @property
    def epochs_used(self) -> int:
        """Passes the source contributes to (highest repeat index + 1; 0 when unused)."""
        return self.whole + (1 if len(self.rows) else 0)

    def tokens(self, tokens: np.ndarray) -> int:
        return self.whole * int(tokens.sum()) + int(tokens[self.rows].sum())


def fmix64(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, in place on a uint64 array (wrapping multiplication)."""
    for multiplier in _FMIX_MULTIPLIERS:
        values ^= values >> _SHIFT
        values *= multiplier
    values ^= values >> _SHIFT
    return values


def pass_key(seed: str, source: str, repeat: int) -> int:
    """K: the first 64 bits of sha256(seed NUL source NUL repeat), big-endian."""
    material = f"{seed}\x00{source}\x00{repeat}".encode()
    return int.from_bytes(hashlib.sha256(material).digest()[:8], "big")


def selection_keys(digest_bits: np.ndarray, seed: str, source: str, repeat: int) -> np.ndarray:
    """fmix64(D ^ K) for every record of ``source`` in pass ``repeat`` (a new array)."""
    return fmix64(digest_bits ^ np.uint64(pass_key(seed, source, repeat)))


def digest_bits(digests: pa.Array) -> np.ndarray:
    """D of each digest: the first 16 of its last 64 hex characters as a uint64, vectorised."""
    out = np.empty(len(digests), dtype=np.uint64)
    for start in range(0, len(digests), _PARSE_BATCH):
        part = digests.slice(start, _PARSE_BATCH)
        out[start : start + len(part)] = _hex_words(_hex_prefixes(part))
    return out


def _hex_prefixes(digests: pa.Array) -> np.ndarray:
    """The 16 characters at [-64:-48] of each digest as a (count, 16) uint8 matrix.

    Digests of one width (the layer's ``sha256:<hex>``) are a strided view of the Arrow data
    buffer; mixed widths go through Arrow's (slower) ``utf8_slice_codeunits``."""
    if digests.null_count:
        raise MixingError(f"{digests.null_count} train records have no record_digest")
    chars = _char_matrix(digests)
    if chars is not None and chars.shape[1] >= 64:
        return chars[:, chars.shape[1] - 64 : chars.shape[1] - 48]
    chars = _char_matrix(pc.utf8_slice_codeunits(digests, -64, -48))
    if chars is None or chars.shape[1] != 16:
        raise MixingError("a record_digest is not a sha256 hex digest (64 hex digits at its end)")
    return chars


def _char_matrix(strings: pa.Array) -> np.ndarray | None:
    """The bytes of equally long strings as a (count, width) view; None when widths differ."""
    count = len(strings)
    wide = pa.types.is_large_string(strings.type)
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int64 if wide else np.int32)
    offsets = offsets[strings.offset : strings.offset + count + 1]
    width = int(offsets[1] - offsets[0]) if count else 0
    if count and not (np.diff(offsets) == width).all():
        return None
    data = strings.buffers()[2]
    chars = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
    return chars[offsets[0] : offsets[0] + count * width].reshape(count, width)


def _hex_words(hexes: np.ndarray) -> np.ndarray:
    """Rows of 16 hex digits as big-endian uint64s; a non-hex digit raises ``MixingError``."""
    nibbles = _HEX_VALUE[hexes]
    if (nibbles == _NOT_HEX).any():
        raise MixingError("a record_digest is not a sha256 hex digest (64 hex digits at its end)")
    octets = (nibbles[:, 0::2] << np.uint8(4)) | nibbles[:, 1::2]
    return np.ascontiguousarray(octets).view(">u8").ravel().astype(np.uint64)


def _packed_order(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order of ``keys`` by their top bits, then index, and the slots of that order whose
    top bits tie (runs the caller re-sorts by full key and its own tie-breaker).

    One in-place sort of uint64s packing a key's top bits above its index: a direct sort is
    faster than an argsort. Ties need equal top (64 - log2 n) bits: ~n^2 / 2^(65 - log2 n)
    pairs of uniform keys, ~45 at 10M."""
    count = len(keys)
    index_bits = max(1, (count - 1).bit_length())
    shift = np.uint64(index_bits)
    packed = (keys >> shift) << shift
    packed |= np.arange(count, dtype=np.uint64)
    packed.sort()
    heads = packed >> shift
    tied = np.flatnonzero(heads[1:] == heads[:-1])
    del heads
    order = (packed & np.uint64((1 << index_bits) - 1)).astype(np.int64)
    # runs of equal top bits, in ascending key order: re-sorting their union keeps each in place
    return order, np.union1d(tied, tied + 1)


def _first(keys: np.ndarray, k: int, ordered: bool) -> np.ndarray:
    """Rows of the first ``k`` records in (key, row) order; in that order when ``ordered``."""
    threshold = np.partition(keys, k - 1)[k - 1]
    below = np.flatnonzero(keys < threshold)
    rows = np.concatenate([below, np.flatnonzero(keys == threshold)[: k - len(below)]])
    if not ordered:
        return rows
    order, slots = _packed_order(keys[rows])
    entries = order[slots]
    order[slots] = entries[np.lexsort((rows[entries], keys[rows[entries]]))]
    return rows[order]


def _token_prefix(keys: np.ndarray, tokens: np.ndarray, left: int) -> np.ndarray:
    """Rows of the shortest (key, row)-ordered prefix whose tokens reach ``left``.

    Sorts only a candidate prefix (a guess from the mean length, doubled until it reaches)."""
    count = len(keys)
    guess = min(count, int(left * count / max(int(tokens.sum()), 1) * 1.1) + 16)
    while True:
        rows = _first(keys, guess, ordered=True)
        reach = np.cumsum(tokens[rows])
        if reach[-1] >= left or guess == count:
            return rows[: min(int(np.searchsorted(reach, left)) + 1, len(rows))]
        guess = min(count, guess * 2)


def select_source(
    seed: str, plan: SourcePlan, bits: np.ndarray, tokens: np.ndarray, unit: str
) -> Selection:
    """The (record, pass) pairs of one source (its members' ``digest_bits`` and token counts)
    that realise ``plan.amount`` units."""
    nothing, count = np.empty(0, dtype=np.int64), len(bits)
    if plan.amount <= 0 or not count:
        return Selection(0, nothing, count)
    per_pass = count if unit == "documents" else int(tokens.sum())
    if per_pass <= 0:
        raise MixingError(f"source {plan.source!r} needs {plan.amount} {unit} but has none")
    whole, left = divmod(plan.amount, per_pass)
    if not left:
        return Selection(whole, nothing, count)
    keys = selection_keys(bits, seed, plan.source, whole)
    if unit == "documents":
        return Selection(whole, _first(keys, left, ordered=False), count)
    return Selection(whole, _token_prefix(keys, tokens, left), count)


MIX_COLUMNS = pa.schema(
    [
        ("position", pa.int64()),
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("repeat", pa.int64()),
        ("weight", pa.string()),
    ]
)


@dataclass
class Stream:
    """Every selected (record, pass) as parallel arrays; ``row`` indexes the concatenation of
    the sources' record ids (in plan order), ``source`` the plan list."""

    key: np.ndarray
    row: np.ndarray
    repeat: np.ndarray
    source: np.ndarray

    def release_sorted(self, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """row, repeat and source in ``order``; each array is dropped from the stream once
        gathered, so at most one extra column is alive (the stream is empty afterwards)."""
        none = np.empty(0, dtype=np.int64)
        self.key = none
        row, self.row = self.row[order], none
        repeat, self.repeat = self.repeat[order], none
        source, self.source = self.source[order], none
        return row, repeat, source


def stream_of(
    seed: str, plans: list[SourcePlan], picks: dict[str, Selection], bits: dict[str, np.ndarray]
) -> Stream:
    """The selected pairs of all sources, keys recomputed into preallocated arrays: a source's
    whole passes as one (passes x records) block, then its partial pass."""
    total = sum(pick.docs for pick in picks.values())
    stream = Stream(
        np.empty(total, np.uint64),
        np.empty(total, np.int64),
        np.empty(total, np.int32),
        np.empty(total, np.int32),
    )
    at = base = 0
    for index, plan in enumerate(plans):
        pick, own = picks[plan.source], bits[plan.source]
        span = pick.whole * len(own)
        if span:
            passes = range(pick.whole)
            pass_keys = np.array([pass_key(seed, plan.source, r) for r in passes], np.uint64)
            block = stream.key[at : at + span].reshape(pick.whole, len(own))
            fmix64(np.bitwise_xor(own[None, :], pass_keys[:, None], out=block))
            stream.row[at : at + span].reshape(block.shape)[:] = np.arange(base, base + len(own))
            stream.repeat[at : at + span].reshape(block.shape)[:] = np.arange(pick.whole)[:, None]
        end = at + span + len(pick.rows)
        stream.key[at + span : end] = selection_keys(own[pick.rows], seed, plan.source, pick.whole)
        stream.row[at + span : end] = pick.rows + base
        stream.repeat[at + span : end] = pick.whole
        stream.source[at:end] = index
        at, base = end, base + len(own)
    return stream


def stream_order(stream: Stream, record_ids: pa.Array) -> np.ndarray:
    """The permutation putting ``stream`` in (key, record_id, repeat) order: the packed sort,
    then an Arrow sort of the tied runs' few entries by full key, record_id and repeat."""
    order, slots = _packed_order(stream.key)
    if slots.size:
        entries = order[slots]
        ties = pa.table(
            {
                "key": stream.key[entries],
                "record_id": record_ids.take(pa.array(stream.row[entries])),
                "repeat": stream.repeat[entries],
            }
        )
        rank = pc.sort_indices(ties, [(c, "ascending") for c in ties.column_names])
        order[slots] = entries[rank.to_numpy()]
    return order


def mix(
    seed: str, unit: str, plans: list[SourcePlan], members: dict[str, Members], weighted: bool
) -> tuple[pa.Table, dict[str, Selection]]:
    """The ordered sample table (built with Arrow ``take``) and each source's selection."""
    groups, picks = mix_groups(seed, unit, plans, members, weighted)
    tables = list(groups)
    return (pa.concat_tables(tables) if tables else MIX_COLUMNS.empty_table()), picks


def mix_groups(
    seed: str,
    unit: str,
    plans: list[SourcePlan],
    members: dict[str, Members],
    weighted: bool,
    rows: int = 1 << 20,
) -> tuple[Iterator[pa.Table], dict[str, Selection]]:
    """The ordered sample table as consecutive tables of ``rows`` rows (built lazily, so only
    one is alive: a row group of the stored table) and each source's selection."""
    bits = {p.source: members[p.source].digest_bits() for p in plans}
    picks = {
        p.source: select_source(seed, p, bits[p.source], members[p.source].tokens, unit)
        for p in plans
    }
    stream = stream_of(seed, plans, picks, bits)
    del bits  # the stream holds the keys now
    record_ids = pa.concat_arrays([members[p.source].record_id.cast(pa.string()) for p in plans])
    order, repeats, source_index = stream.release_sorted(stream_order(stream, record_ids))
    names = pa.array([p.source for p in plans], pa.string())
    weights = pa.array([decimal_text(p.weight) if weighted else "1" for p in plans], pa.string())

    def groups() -> Iterator[pa.Table]:
        for start in range(0, len(order), rows):
            end = min(start + rows, len(order))
            source = pa.array(source_index[start:end])
            yield pa.table(
                {
                    "position": pa.array(np.arange(start, end, dtype=np.int64)),
                    "record_id": record_ids.take(pa.array(order[start:end])),
                    "source_id": names.take(source),
                    "repeat": pa.array(repeats[start:end].astype(np.int64)),
                    "weight": weights.take(source),
                },
                schema=MIX_COLUMNS,
            )

    return groups(), picks


def weights_over_bound(plans: list[SourcePlan], max_weight: Decimal | None) -> set[str]:
    """Sources whose importance weight q_i / p_i exceeds ``max_weight``, each logged as a warning
    (a large weight means few real documents stand for a large share of the mix)."""
    if max_weight is None:
        return set()
    over = set()
    for plan in plans:
        if plan.weight > Fraction(max_weight):
            log.warning(
                "mixing: source %r has importance weight %s, above max_weight %s",
                plan.source,
                decimal_text(plan.weight),
                max_weight,
            )
            over.add(plan.source)
    return over


def report(
    plans: list[SourcePlan],
    members: dict[str, Members],
    picks: dict[str, Selection],
    max_weight: Decimal | None = None,
) -> list[dict]:
    """Per source: population, target share, selection, realised shares (decimal text), weight."""
    docs = {p.source: picks[p.source].docs for p in plans}
    tokens = {p.source: picks[p.source].tokens(members[p.source].tokens) for p in plans}
    all_docs, all_tokens = sum(docs.values()), sum(tokens.values())
    over = weights_over_bound(plans, max_weight)
    rows = []
    for plan in plans:
        own = members[plan.source]
        rows.append(
            {
                "source": plan.source,
                "population_docs": len(own.record_id),
                "population_tokens": int(np.sum(own.tokens)),
                "target_share": decimal_text(plan.target),
                "selected_docs": docs[plan.source],
                "selected_tokens": tokens[plan.source],
                "doc_share": decimal_text(Fraction(docs[plan.source], all_docs or 1)),
                "token_share": decimal_text(Fraction(tokens[plan.source], all_tokens or 1)),
                "max_epochs": plan.max_epochs,
                "epochs_used": picks[plan.source].epochs_used,
                "cap_hit": plan.cap_hit,
                "weight": decimal_text(plan.weight),
                "weight_over_bound": plan.source in over,
            }
        )
    return rows

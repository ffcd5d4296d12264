"""The streamed signature file: the bytes of the whole-chunk ``.npy``, however it is batched."""

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.dedup import signature_cache
from corpus_assets.core.dedup.minhash import (
    SignatureSpec,
    shingling,
    signatures,
    signatures_and_modes,
)
from corpus_assets.core.dedup.signature_cache import (
    BandMajorFile,
    band_major_npy,
    load_modes,
    write_band_major,
)


def _texts(count: int, seed: int) -> list[str]:
    """Texts with repeats near and far (across batches), an empty text and a CJK one."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    texts = [" ".join(rng.choices(words, k=rng.randint(1, 40))) for _ in range(count)]
    for i in range(0, count, 7):
        texts[i] = texts[rng.randrange(count)]  # an earlier or later copy
    texts[3] = ""
    texts[5] = "日本語の文章はスペースなしで書かれる" * 3
    return texts


def _parquet(tmp_path: Path, texts: list[str]) -> pq.ParquetFile:
    path = tmp_path / "records.parquet"
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), path, row_group_size=100)
    return pq.ParquetFile(path)


def _expected(texts: list[str], spec: SignatureSpec) -> bytes:
    """The chunk file: the signatures band-major, then (v3) a row of the shingle modes."""
    if spec.version == "minhash.v2":
        return band_major_npy(signatures(texts, spec).reshape(len(texts), spec.num_perm))
    sig, modes = signatures_and_modes(texts, spec)
    return band_major_npy(np.column_stack([sig, modes.astype(np.uint32)]))


@pytest.mark.parametrize("version", ["minhash.v2", "minhash.v3"])
@pytest.mark.parametrize(("rows", "chars"), [(1 << 12, 1 << 24), (37, 1 << 24), (1000, 500)])
def test_streamed_signatures_have_the_whole_chunks_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int, chars: int, version: str
) -> None:
    texts = _texts(700, seed=rows)
    spec = SignatureSpec(version=version, num_perm=16)
    monkeypatch.setattr(signature_cache, "BATCH_ROWS", rows)
    monkeypatch.setattr(signature_cache, "BATCH_CHARS", chars)
    out = tmp_path / "sig.npy"
    write_band_major(out, _parquet(tmp_path, texts), len(texts), spec)
    assert out.read_bytes() == _expected(texts, spec)
    block = BandMajorFile.open(out)
    assert (block.num_perm, block.records) == (16 + (version == "minhash.v3"), 700)
    modes = load_modes([block], spec)
    if version == "minhash.v3":  # text 5 is Japanese: the one unspaced text (and its copies)
        assert modes is not None and modes[5] and modes.sum() == texts.count(texts[5])
    else:
        assert modes is None


def test_an_empty_chunk_and_a_wrong_count(tmp_path: Path) -> None:
    spec = SignatureSpec(num_perm=8)
    out = tmp_path / "sig.npy"
    write_band_major(out, _parquet(tmp_path, []), 0, spec)
    assert out.read_bytes() == _expected([], spec)
    with pytest.raises(ValueError, match="3 texts read, 4 expected"):
        write_band_major(out, _parquet(tmp_path, ["a", "b", "c"]), 4, spec)


def _is_unspaced_by_lists(norm: str) -> bool:
    """The rule as first written (lists of characters): the reference for the counted one."""
    if norm.isascii():
        return False
    found = shingling._UNSPACED.findall(norm)
    if not found:
        return False
    other = len(shingling._LETTER.findall(norm)) - sum(c.isalpha() for c in found)
    return len(found) * 3 >= len(found) + other


def test_is_unspaced_agrees_with_the_list_rule_on_mixed_scripts() -> None:
    # Han, kana, Thai letters and digits, Tibetan half digits (numeric, not letters), Khmer
    # symbols, an astral ideograph, Latin letters, digits, marks, superscripts and spaces.
    alphabet = "漢字かなカナกขค๑๒ཀཁ༪༫ក៰𠀀ab é1²_ -"
    rng = random.Random(7)
    texts = ["".join(rng.choices(alphabet, k=rng.randint(1, 30))) for _ in range(4000)]
    texts += ["ab 漢", "abc 漢", "༪༫༬ ab", "ཀ༪ a", "a" * 10 + "漢" * 5, "a" * 11 + "漢" * 5]
    assert [shingling.is_unspaced(t) for t in texts] == [_is_unspaced_by_lists(t) for t in texts]

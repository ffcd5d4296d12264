"""minhash.v3: a pair of texts and its translation into an unspaced script get one verdict.

The fixture is a man-page-like description of ``sha1sum`` and of ``sha384sum`` in English,
Japanese and Chinese (written for this test). In English the two pages share too few word
5-shingles to be near duplicates; v2's character 5-shingles of the translations overlap far
more and removed one, v3 shingles ICU words and keeps both, as in English.
"""

from decimal import Decimal
from typing import Any

import pytest
from icu4py.breakers import WordBreaker
from pydantic import ValidationError

from corpus_assets.assets.metadata import layer_metadata
from corpus_assets.core.dedup.minhash import normalise
from corpus_assets.core.dedup.minhash.segment import segment_words
from corpus_assets.core.dedup.report import NearReport
from corpus_assets.core.dedup.verdicts import KEEP, NEAR
from corpus_assets.core.runtime.config import NearDedupPolicy
from corpus_assets.core.runtime.layer_index import LayerResult
from corpus_assets_tests.core.dedup.test_near_dedup import _cluster, _shingle_jaccard

EN = (
    "{cmd} prints or checks {alg} ({bits}-bit) checksums. With no FILE, or when FILE is -, "
    "it reads standard input. In check mode it reads {alg} sums from the FILEs and checks "
    "them. The sums are computed as described in FIPS-180-2. When checking, the input should "
    "be a former output of this program. The default mode is to print a line with the "
    "checksum, a space, a character indicating the input mode and the name of each FILE. "
    "The --tag option creates a BSD-style {alg} checksum. Full documentation of {cmd} is "
    "available in the info manual."
)
JA = (
    "{cmd} は {alg} ({bits} ビット) チェックサムを表示または照合します。ファイルの指定がない場合や"
    "ファイルが - の場合、標準入力から読み込みます。照合モードではファイルから {alg} チェックサムを"
    "読み込んで照合します。チェックサムは FIPS-180-2 の記述に従って計算されます。照合する場合、"
    "入力はこのプログラムの以前の出力でなければなりません。既定のモードでは、チェックサム、空白、"
    "入力モードを示す文字、各ファイルの名前を一行に表示します。--tag オプションは BSD 形式の {alg} "
    "チェックサムを作成します。{cmd} の完全なドキュメントは info マニュアルにあります。"
)
ZH = (
    "{cmd} 显示或检查 {alg} ({bits} 位) 校验和。如果没有指定文件，或者文件为 - ，则从标准输入读取。"
    "在检查模式下，从文件中读取 {alg} 校验和并进行检查。校验和按照 FIPS-180-2 中的描述计算。"
    "检查时，输入应当是本程序以前的输出。默认模式是为每个文件输出一行，包括校验和、一个空格、"
    "表示输入模式的字符以及文件名。--tag 选项创建 BSD 风格的 {alg} 校验和。{cmd} 的完整文档"
    "可以在 info 手册中找到。"
)
SHA1 = {"cmd": "sha1sum", "alg": "SHA1", "bits": "160"}
SHA384 = {"cmd": "sha384sum", "alg": "SHA384", "bits": "384"}
V2 = NearDedupPolicy(signature="minhash.v2")


def _pair(template: str, lang: str) -> list[tuple[str, str]]:
    return [
        (f"{lang}/sha1sum", template.format(**SHA1)),
        (f"{lang}/sha384", template.format(**SHA384)),
    ]


def _long_ja() -> str:
    """A long Japanese text: the page for five made-up commands."""
    return "".join(JA.format(cmd=f"tool{i}", alg=f"ALG{i}", bits=str(100 + i)) for i in range(5))


def test_translated_pages_of_different_commands_get_the_english_verdict() -> None:
    rows = _pair(EN, "en") + _pair(JA, "ja") + _pair(ZH, "zh")
    new, _ = _cluster(rows)
    old, _ = _cluster(rows, V2)
    en_j = _shingle_jaccard(rows[0][1], rows[1][1], NearDedupPolicy())
    assert en_j < 0.7  # English: different commands, kept by both versions

    def verdicts(out: dict[str, Any], lang: str) -> list[str]:
        return sorted(out[f"{lang}/{cmd}"]["verdict"] for cmd in ("sha1sum", "sha384"))

    assert verdicts(new, "en") == verdicts(old, "en") == [KEEP, KEEP]
    for lang in ("ja", "zh"):
        a, b = (t for rid, t in rows if rid.startswith(lang))
        # The character shingles of the translation overlap more than the English words did...
        assert _shingle_jaccard(a, b, V2) >= 0.8
        assert verdicts(old, lang) == [KEEP, NEAR]
        # ... its ICU words about as much: v3 keeps both pages, as English does.
        assert _shingle_jaccard(a, b, NearDedupPolicy()) < 0.8
        assert verdicts(new, lang) == [KEEP, KEEP]


def test_one_changed_character_in_a_long_japanese_text_is_still_removed() -> None:
    text = _long_ja()
    middle = len(text) // 2
    edited = text[:middle] + ("ア" if text[middle] != "ア" else "イ") + text[middle + 1 :]
    out, _ = _cluster([("ja/a", text), ("ja/b", edited), ("ja/c", JA.format(**SHA1))])
    assert out["ja/b"]["verdict"] == NEAR and out["ja/b"]["match_id"] == "ja/a"
    assert out["ja/b"]["match_jaccard"] >= 0.9
    assert out["ja/c"]["verdict"] == KEEP


def _report_rows(report: NearReport) -> list[dict[str, Any]]:
    return [r.model_dump(by_alias=True) for r in report.near_dedup_by_script]


def test_report_counts_records_and_removals_per_script_class() -> None:
    text = _long_ja()
    rows = [
        *_pair(EN, "en"),
        ("en/copy", EN.format(**SHA1).replace(" manual.", ".")),
        ("ja/a", text),
    ]
    rows += [("ja/b", text.replace("。", "．", 1))]
    out, report = _cluster(rows)
    assert [out[r]["verdict"] for r, _ in rows] == [KEEP, KEEP, NEAR, KEEP, NEAR]
    assert _report_rows(report) == [
        {
            "class": "document/prose",
            "script": "word",
            "records": 3,
            "removed": 1,
            "threshold": "0.8",
        },
        {
            "class": "document/prose",
            "script": "char",
            "records": 2,
            "removed": 1,
            "threshold": "0.8",
        },
    ]
    # An own threshold for unspaced scripts: the Japanese copy (J ~0.97) is kept at 0.99.
    strict = NearDedupPolicy(char_threshold=Decimal("0.99"))
    out, report = _cluster(rows, strict)
    assert [out[r]["verdict"] for r, _ in rows] == [KEEP, KEEP, NEAR, KEEP, KEEP]
    assert [(r["script"], r["removed"], r["threshold"]) for r in _report_rows(report)] == [
        ("word", 1, "0.8"),
        ("char", 0, "0.99"),
    ]
    # v2 knows no modes: one row for all records, one threshold.
    _, report = _cluster(rows, V2)
    assert [(r["script"], r["records"], r["threshold"]) for r in _report_rows(report)] == [
        ("all", 5, "0.8")
    ]


def test_dagster_metadata_has_the_per_script_table_and_series() -> None:
    text = _long_ja()
    rows = [*_pair(EN, "en"), ("ja/a", text), ("ja/b", text.replace("。", "．", 1))]
    _, report = _cluster(rows)
    details = {k: v for k, v in report.model_dump(by_alias=True).items()}
    counts = {
        "records": 4,
        "kept": 3,
        "removed": 1,
        "exact_duplicates": 0,
        "near_duplicates": 1,
        "clusters": 3,
        "leakage_groups": 3,
    }
    metadata = layer_metadata(LayerResult("dedup_clusters", "sha256:x", counts, details=details))
    table = metadata["near_dedup_by_script"]
    assert [c.name for c in table.schema.columns] == [
        "class",
        "script",
        "records",
        "removed",
        "threshold",
    ]
    assert [c.type for c in table.schema.columns][2:] == ["int", "int", "float"]
    assert [r.data["script"] for r in table.records] == ["word", "char"]
    assert metadata["removed.char"].value == 1.0 and metadata["removed.word"].value == 0.0
    assert metadata["records.char"].value == 2.0 and metadata["records.word"].value == 2.0


def test_char_threshold_is_a_v3_setting_never_below_the_threshold() -> None:
    with pytest.raises(ValidationError, match=r"needs signature minhash\.v3"):
        NearDedupPolicy(signature="minhash.v2", char_threshold=Decimal("0.9"))
    with pytest.raises(ValidationError, match="below threshold"):
        NearDedupPolicy(char_threshold=Decimal("0.7"))
    assert NearDedupPolicy().signature == "minhash.v3"


def test_a_long_text_is_segmented_in_pieces_with_the_whole_texts_words() -> None:
    text = normalise(" ".join([_long_ja()] * 120))  # ~180k characters
    assert len(text) > 2 * (1 << 16)
    whole = " ".join(w for w in WordBreaker(text, "und") if not w.isspace())
    assert segment_words(text) == whole

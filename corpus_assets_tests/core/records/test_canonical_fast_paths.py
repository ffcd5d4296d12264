"""The fast canonicalisation paths give the bytes of the per-record functions they replaced.

``script_of`` (numpy table) against ``script_by_names`` (the rule, one letter at a time), and
``record_digest`` (a per-source JSON template) against ``json_digest`` of the whole envelope, on
random and adversarial inputs: ties between scripts, the 64-letter sample boundary, the
2,048-character head, astral letters, digits and underscores that look like letters.
"""

import json
import unicodedata
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corpus_assets.core.records import scripts
from corpus_assets.core.records.envelope import envelope, record_digest
from corpus_assets.core.records.scripts import script_by_names, script_of, scripts_of
from corpus_assets.core.storage.digests import canonical_json, json_digest
from corpus_assets_tests.paths import CORPORA

# A few letters of every listed script, letters of none (Ethiopic, Cherokee), astral CJK,
# look-alikes that are not letters (digits, superscripts, fractions, underscore), marks.
PIECES = list(
    "aZéßœ"
    "жЯё"
    "αΩ"
    "بع"
    "שא"
    "कख"
    "অক"
    "தக"
    "తక"
    "กข"
    "한글"
    "ひら"
    "カナ"
    "漢字"
    "აბ"
    "աբ"
    "ሀሁ"
    "Ꭰ"
    "\U00020000\U00030001\U00031350"
    "0٣²½_ \n.-\u0301\u200d"
)
MIXED = st.text(st.sampled_from(PIECES), max_size=200)
ANY_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=300)


@settings(max_examples=400, deadline=None)
@given(st.one_of(MIXED, ANY_TEXT))
@example("é")
@example("ж" * 32 + "a" * 32)  # a tie: the script seen first wins
@example("a" * 32 + "ж" * 32)
@example("a" * 63 + "é" + "ж" * 100)  # the sample ends inside the non-ASCII part
@example("a" * 64 + "ж" * 100)  # the sample is all ASCII
@example("_1²" * 30 + "ж")
@example("x" * 2047 + "ж")
@example(" " * 2048 + "ж")
@example("\U00030001" * 5 + "a")
@example("ሀሁ é")
def test_script_of_matches_the_per_letter_rule(text: str) -> None:
    assert script_of(text) == script_by_names(text)


@given(st.lists(st.sampled_from(PIECES), max_size=200), st.integers(1, 80))
@settings(max_examples=200, deadline=None)
def test_script_of_matches_at_any_sample_size(pieces: list[str], sample: int) -> None:
    text = "".join(pieces)
    assert script_of(text, sample) == script_by_names(text, sample)


def _fresh_table(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """This process's script lookups forgotten; returns the characters named from now on."""
    monkeypatch.setattr(scripts, "_TABLE", np.full(0x110000, scripts._UNSEEN, dtype=np.uint8))
    named: list[str] = []

    def name(char: str, default: str = "") -> str:
        named.append(char)
        return unicodedata.name(char, default)

    monkeypatch.setattr(scripts, "unicodedata", SimpleNamespace(name=name))
    return named


def test_a_few_texts_look_up_only_their_own_letters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that canonicalises a few records (a +1% child's new chunks) names the letters
    it meets, not all 1.1M code points (~0.15 CPU-s), and gets the rule's answers."""
    texts = ["Привет, мир", "漢字かな交じり文", "αβγ abc", "plain ascii", "ሀሁ é"]
    expected = [script_by_names(t) for t in texts]
    named = _fresh_table(monkeypatch)
    assert scripts_of(texts) == expected
    assert [script_of(t) for t in texts] == expected
    assert 0 < len(named) <= len(set("".join(texts)))


def test_lazy_lookups_equal_the_whole_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Code points looked up one by one (surrogates, astral planes, non-characters included)
    get the codes of the one-pass table, and a batch with more unseen code points than
    ``WHOLE_TABLE_AFTER`` fills the whole table."""
    _fresh_table(monkeypatch)
    sparse = np.arange(0, 0x110000, 97, dtype=np.uint32)  # fewer than WHOLE_TABLE_AFTER
    lazy = scripts._codes(sparse).copy()
    assert (scripts._TABLE == scripts._UNSEEN).sum() == 0x110000 - len(sparse)
    everything = scripts._codes(np.arange(0x110000, dtype=np.uint32))
    assert (scripts._TABLE == scripts._UNSEEN).sum() == 0
    assert np.array_equal(lazy, everything[sparse])
    assert everything.max() == len(scripts._CODES)  # every listed script has letters


STRINGS = st.text(max_size=40) | st.sampled_from(
    ['"', "\\", "\x00\x1f\x7f", "é\u2028", "\U0001f600"]
)
OPTIONAL = st.none() | STRINGS
PII = st.dictionaries(st.sampled_from(["email", "ip", "phone", "secret"]), st.integers(1, 10**6))
TURN = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": STRINGS},
    optional={
        "tool_calls": st.lists(st.fixed_dictionaries({"id": STRINGS, "name": STRINGS})),
        "tool_call_id": STRINGS,
    },
)
PAYLOAD = st.one_of(
    st.fixed_dictionaries({"text": STRINGS}),
    st.fixed_dictionaries({"messages": st.lists(TURN, min_size=1, max_size=4)}),
    st.fixed_dictionaries({"prompt": STRINGS, "chosen": STRINGS, "rejected": STRINGS}),
)
MEMBERS = {
    "record_id": STRINGS,
    "group_id": STRINGS,
    "source_id": STRINGS,
    "kind": STRINGS,
    "adapter": STRINGS,
    "lang": OPTIONAL,
    "script": STRINGS,
    "licence": OPTIONAL,
    "purposes": st.none() | st.lists(STRINGS, max_size=3),
    "retention": OPTIONAL,
    "pii": PII,
    "event_time": OPTIONAL,
}
# Constant members that hold the template's own marker strings take the whole-JSON path.
MARKERS = st.sampled_from(["\x000\x00", "\x006\x00", "a\x003\x00b"])


def _check(members: dict[str, Any], payload: dict[str, Any]) -> None:
    expected = json_digest({**envelope(**members), "payload": payload})
    assert record_digest(**members, payload_json=canonical_json(payload).decode()) == expected


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries(MEMBERS), PAYLOAD)
@example(
    {**dict.fromkeys(MEMBERS, ""), "purposes": None, "pii": {}, "lang": None, "licence": None},
    {"text": ""},
)
def test_record_digest_is_the_digest_of_the_whole_record(
    members: dict[str, Any], payload: dict[str, Any]
) -> None:
    _check(members, payload)


@settings(max_examples=50, deadline=None)
@given(st.fixed_dictionaries({**MEMBERS, "source_id": MARKERS, "licence": MARKERS}), PAYLOAD)
def test_record_digest_when_a_constant_looks_like_a_marker(
    members: dict[str, Any], payload: dict[str, Any]
) -> None:
    _check(members, payload)


CORPORA = CORPORA


@pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is absent")
@pytest.mark.parametrize("name", ["chat-dialogs", "fortunes"])
def test_script_of_matches_the_per_letter_rule_on_real_text(name: str) -> None:
    """28 languages and scripts (chat-dialogs), Chinese and Cyrillic fortunes."""
    texts = []
    for path in sorted((CORPORA / name).glob("*.jsonl.zst")):
        for line in zstandard.decompress(path.read_bytes()).splitlines():
            row = json.loads(line)
            turns = (row.get("meta") or {}).get("messages") or []
            texts += [row["text"], *(t["content"] for t in turns if isinstance(t, dict))]
    assert len({script_by_names(t) for t in texts}) >= 3
    assert [script_of(t) for t in texts] == [script_by_names(t) for t in texts]

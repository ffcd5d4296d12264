"""Peak memory of one record of ``--chars`` characters through each row stage.

Each stage runs in a fresh child process: the child builds the record's JSONL line (and its
text), the stage's inputs and a small benchmark index, then resets the kernel's peak-RSS mark
(``/proc/self/clear_refs`` 5) with ``VmRSS`` as the baseline, runs the stage once and reads
``VmHWM``. ``extra`` = peak - baseline, against the record's UTF-8 size. Stages:

- ``parse``: ``parse_line`` (orjson) of the line;
- ``normalize``: ``normalize_parts`` on the text;
- ``pii``: ``redact_parts`` on the text;
- ``quality``: ``check_quality`` with every rule on (symbol/alpha ratios, repeated lines,
  repeated 3-grams) - a text at the limit must be judged, not only counted;
- ``contamination``: ``contaminated`` (the benchmark screen) on the text;
- ``row``: the whole row path of the layer: ``parse_line``, ``canonical_record`` (normalise,
  PII, quality) and ``KeptRecords`` (screen, envelope, Arrow columns, the object's table).

Texts: ``docs`` (the shared python-docs corpus repeated: real prose and code; skipped when
``/work/shared`` is absent), ``ascii`` (digit-heavy: a number in every word, an e-mail per
paragraph - the PII number scan's worst case), ``cjk`` (Chinese, 3 UTF-8 bytes per character,
2 per character as a Python str). Exits non-zero if a stage's extra is
above ``--limit`` times the record's size.

Usage: .venv/bin/python bench/max_chars_memory.py [--chars 16000000] [--limit 10]
"""

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

STAGES = ("parse", "normalize", "pii", "quality", "contamination", "row")
WORDS = "the of and to in is was for on that with as by at from it an be this are or".split()  # noqa: SIM905
DOCS = Path("/work/shared/corpora/python-docs/python-docs-00000.jsonl.zst")


def _docs_text(chars: int) -> str:
    """The python-docs corpus's texts, repeated to ``chars`` (real prose, code and numbers)."""
    from corpus_assets.core.ingest.codecs import iter_lines

    with DOCS.open("rb") as handle:
        texts = [json.loads(line)["text"] for _, line in iter_lines(handle, str(DOCS))]
    whole = "\n\n".join(texts)
    return (whole * (chars // len(whole) + 1))[:chars]


def make_text(kind: str, chars: int) -> str:
    """A deterministic text of exactly ``chars`` characters."""
    if kind == "docs":
        return _docs_text(chars)
    rng = random.Random(7)
    parts: list[str] = []
    size = 0
    while size < chars:
        if kind == "cjk":
            para = "".join(chr(0x4E00 + rng.randrange(3000)) for _ in range(200)) + "。\n"
        else:
            words = [rng.choice(WORDS) + str(rng.randrange(10**6)) for _ in range(60)]
            para = " ".join(words) + f" mail u{rng.randrange(10**6)}@example.org.\n"
        parts.append(para)
        size += len(para)
    return "".join(parts)[:chars]


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def child(stage: str, kind: str, chars: int) -> dict[str, Any]:
    """Run one stage on one record in this process; its peak extra memory."""
    from corpus_assets.core.records import canonicalize as c
    from corpus_assets.core.records.contamination import BenchmarkIndex, TokenPolicy
    from corpus_assets.core.records.kept import KeptRecords
    from corpus_assets.core.records.normalize import normalize_parts
    from corpus_assets.core.records.pii import redact_parts
    from corpus_assets.core.records.quality import QualityPolicy, check_quality
    from corpus_assets.core.runtime.config import ObjectsSource

    text = make_text(kind, chars)
    line = json.dumps({"id": "big", "text": text}, ensure_ascii=False).encode()
    size = len(text.encode())
    # items the record does not contain (reversed), so the row is kept and its columns built
    items = [(f"b/{n}", make_text(kind, 2000 + n)[n * 10 :][::-1]) for n in range(20)]
    index = BenchmarkIndex.build(items, TokenPolicy())
    quality = QualityPolicy(
        max_chars=chars,
        max_symbol_ratio_ppm=900_000,
        min_alpha_ratio_ppm=1,
        max_repeated_line_ratio_ppm=999_999,
        max_repeated_ngram_ratio_ppm=999_999,
    )
    stages = c.Stages("pretraining", quality, index)
    source = ObjectsSource.model_validate(
        {"id": "s", "kind": "objects", "path": "/dev/null", "format": "jsonl"}
    )
    runs = {
        "parse": lambda: c.parse_line(line),
        "normalize": lambda: normalize_parts(text, False),
        "pii": lambda: redact_parts(text),
        "quality": lambda: check_quality(text, "prose", quality),
        "contamination": lambda: c.contaminated(index, [text]),
        "row": lambda: _row(c, KeptRecords, source, stages, line),
    }
    if stage in ("parse", "row"):
        del text  # the layer holds only the line when a row starts
    Path("/proc/self/clear_refs").write_text("5")
    baseline = _rss("VmRSS")
    result = runs[stage]()
    peak = _rss("VmHWM")
    return {"extra": peak - baseline, "size": size, "ok": result is not None or stage != "row"}


def _row(c: Any, kept_type: Any, source: Any, stages: Any, line: bytes) -> Any:
    record = c.canonical_record(source, "o.jsonl", 1, c.parse_line(line), stages)
    record.update(source_id="s", object="sha256:" + "0" * 64, line=1, byte_offset=0, cdc_lsn=None)
    kept = kept_type("sha256:" + "0" * 64, stages)
    kept.add(record)
    del record
    table = kept.table()
    return table.num_rows or None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chars", type=int, default=16_000_000)
    parser.add_argument("--limit", type=float, default=10.0)
    parser.add_argument("--kinds", default="docs,ascii,cjk" if DOCS.is_file() else "ascii,cjk")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        stage, kind, chars = args.child
        print(json.dumps(child(stage, kind, int(chars))))
        return
    worst = 0.0
    head = f"one record of {args.chars:,} characters"
    print(f"{head}; extra = peak RSS - baseline (MB)")
    print("| text | UTF-8 MB | " + " | ".join(STAGES) + " |")
    print("|---|---:|" + "---:|" * len(STAGES))
    for kind in args.kinds.split(","):
        cells, size = [], 0
        for stage in STAGES:
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    stage,
                    kind,
                    str(args.chars),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            out = json.loads(done.stdout)
            size = out["size"]
            ratio = out["extra"] / size
            worst = max(worst, ratio)
            cells.append(f"{out['extra'] / 2**20:.0f} ({ratio:.1f}x)")
        print(f"| {kind} | {size / 2**20:.1f} | " + " | ".join(cells) + " |")
    print(f"worst stage: {worst:.1f}x the record's UTF-8 size (limit {args.limit}x)")
    if worst > args.limit:
        sys.exit(1)


if __name__ == "__main__":
    main()

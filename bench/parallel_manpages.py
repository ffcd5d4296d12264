"""Script-consistency of near-dedup verdicts, measured on Debian's translated man pages.

Ground truth: a pair of pages in language L should get the verdict its English counterpart
gets (English is word mode, the reference the 0.8 threshold was chosen for). The pages:
English from ``/usr/share/man`` (plus the ``manpages`` package), translations from
``manpages-ja``, ``manpages-zh`` (zh_CN), ``manpages-fr``, ``manpages-de``, rendered with
``man -l`` (overstrike and escapes stripped) and paired by (section, command name). The pairs,
built the same way in English and in L from the commands both have:

- *related*: every pair in one section whose names share their first three characters or are
  similar (difflib ratio >= 0.75): ``true``/``false``, ``sha1sum``/``sha384sum``, ``svn*``...;
- *random*: a seeded sample of other pairs;
- *positives*: a page against itself with one or two paragraphs dropped, only where English
  and L have the same number of paragraphs (po4a translations keep the structure), dropping
  the same paragraph indexes in both: the same small edit applied to the page and its
  translation;
- *truncated*: a page against its first 95/90/85/80/70 % of lines, in English and in L (the
  same share of the content removed from both): near duplicates on both sides of 0.8.

Agreement is given over all pairs and over the *contested* ones (either Jaccard >= 0.5):
random pairs agree trivially.

Per pair it computes the English word-mode Jaccard (the verdict reference) and L's Jaccard
under ``minhash.v2`` (5-character shingles for ja/zh) and ``minhash.v3`` (ICU words, 5-word
shingles), plus the segmentation measure for the floor check: Jaccard of 5-word shingles of
ICU word breaks computed here independently of the signature code. It prints, per language
and rule, the agreement with the English verdict, the removals whose ICU-word Jaccard is below
0.7 and the medians; ``--calibrate`` scans the threshold of unspaced-script pairs for both.

    .venv/bin/python bench/parallel_manpages.py --cache /tmp/manpages-cache [--calibrate]
"""

import argparse
import difflib
import hashlib
import itertools
import json
import os
import random
import re
import resource
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

import numpy as np
from icu4py.breakers import WordBreaker

from corpus_assets.core.dedup.jaccard import jaccard_sorted
from corpus_assets.core.dedup.minhash import (
    VERSION_V2,
    VERSION_V3,
    SignatureSpec,
    fingerprints,
    is_unspaced,
    normalise,
    signatures,
)
from corpus_assets.core.runtime.config import NearDedupPolicy

PACKAGES = ("manpages", "manpages-ja", "manpages-zh", "manpages-fr", "manpages-de")
LANGS = {"ja": "ja", "zh": "zh_CN", "fr": "fr", "de": "de"}
SECTIONS = ("1", "5", "7", "8")
RANDOM_PAIRS = 1500
WORD_FLOOR = 0.7
TRUNCATE = (0.95, 0.9, 0.85, 0.8, 0.7)
CONTESTED = 0.5
KINDS = ("related", "random", "positive", "truncated")
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m|.\x08")


def fetch(cache: Path) -> Path:
    """Download and unpack the packages into ``cache`` (once)."""
    debs, root = cache / "debs", cache / "root"
    debs.mkdir(parents=True, exist_ok=True)
    if not any(debs.glob("manpages-zh_*.deb")):
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=debs, check=True)
    if not root.exists():
        tmp = cache / "root.tmp"
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
        tmp.rename(root)
    return root


def sources(root: Path) -> dict[str, dict[tuple[str, str], Path]]:
    """Per language: (section, name) -> man page file."""
    dirs = {"en": [Path("/usr/share/man"), root / "usr/share/man"]}
    dirs |= {lang: [root / "usr/share/man" / sub] for lang, sub in LANGS.items()}
    out: dict[str, dict[tuple[str, str], Path]] = {}
    for lang, bases in dirs.items():
        pages = out.setdefault(lang, {})
        for base, section in itertools.product(bases, SECTIONS):
            for path in sorted((base / f"man{section}").glob("*")):
                name = path.name.removesuffix(".gz").rsplit(".", 1)[0]
                pages.setdefault((section, name), path)
    return out


def render(path: Path, cache: Path) -> str:
    """The page as ``man`` shows it at 100 columns, cached by the file's digest."""
    data = path.read_bytes()
    key = hashlib.sha256(data).hexdigest()[:24]
    out = cache / "text" / f"{key}.txt"
    if not out.exists():
        env = {**os.environ, "MANWIDTH": "100", "LANG": "C.UTF-8", "MAN_KEEP_FORMATTING": ""}
        env.pop("MANPAGER", None)
        try:
            done = subprocess.run(
                ["man", "-l", str(path)],
                capture_output=True,
                env=env,
                check=False,
                stdin=subprocess.DEVNULL,
                timeout=10,
            )
            text = _ESCAPES.sub("", done.stdout.decode("utf-8", "replace"))
        except subprocess.TimeoutExpired:
            text = ""  # a page groff loops on: left out (empty pages are dropped)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return out.read_text()


def paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def related(names: list[tuple[str, str]]) -> list[tuple[int, int]]:
    """Index pairs of same-section pages with close names."""
    out = []
    for i, j in itertools.combinations(range(len(names)), 2):
        (s1, a), (s2, b) = names[i], names[j]
        if s1 != s2:
            continue
        if a[:3] == b[:3] or difflib.SequenceMatcher(None, a, b).ratio() >= 0.75:
            out.append((i, j))
    return out


def build(pages: dict, lang: str, cache: Path, seed: int = 16) -> tuple[list, list, list]:
    """(English texts, L texts, pairs) where a pair is (kind, i, j, label)."""
    common = sorted(set(pages["en"]) & set(pages[lang]))
    with ThreadPoolExecutor(4) as pool:
        en = list(pool.map(lambda k: render(pages["en"][k], cache), common))
        tr = list(pool.map(lambda k: render(pages[lang][k], cache), common))
    keep = [k for k in range(len(common)) if en[k].strip() and tr[k].strip()]
    common = [common[k] for k in keep]
    en, tr = [en[k] for k in keep], [tr[k] for k in keep]
    pairs = [("related", i, j, f"{common[i][1]}/{common[j][1]}") for i, j in related(common)]
    seen = {(i, j) for _, i, j, _ in pairs}
    rng = random.Random(seed)
    while sum(p[0] == "random" for p in pairs) < min(RANDOM_PAIRS, len(common) ** 2 // 4):
        i, j = sorted(rng.sample(range(len(common)), 2))
        if (i, j) not in seen:
            seen.add((i, j))
            pairs.append(("random", i, j, f"{common[i][1]}/{common[j][1]}"))
    en, tr, pairs = _positives(common, en, tr, pairs, rng)
    return en, tr, pairs


def _positives(common: list, en: list, tr: list, pairs: list, rng: random.Random) -> tuple:
    """Append edited copies (same paragraphs dropped in English and L) and their pairs."""
    en, tr = list(en), list(tr)
    for k in range(len(common)):
        pe, pt = paragraphs(en[k]), paragraphs(tr[k])
        if len(pe) != len(pt) or len(pe) < 6:
            continue
        drop = set(rng.sample(range(1, len(pe) - 1), 1 + (k % 2)))
        en.append("\n\n".join(p for i, p in enumerate(pe) if i not in drop))
        tr.append("\n\n".join(p for i, p in enumerate(pt) if i not in drop))
        pairs.append(("positive", k, len(en) - 1, f"{common[k][1]}-{len(drop)}"))
    for k in range(len(common)):
        keep = TRUNCATE[k % len(TRUNCATE)]
        le, lt = en[k].splitlines(), tr[k].splitlines()
        if len(le) < 20 or len(lt) < 20:
            continue
        en.append("\n".join(le[: round(len(le) * keep)]))
        tr.append("\n".join(lt[: round(len(lt) * keep)]))
        pairs.append(("truncated", k, len(en) - 1, f"{common[k][1]}@{keep}"))
    return en, tr, pairs


def icu_words(text: str, lang: str) -> list[str]:
    norm = normalise(text)
    return [w for w in WordBreaker(norm, lang) if not w.isspace()]


def shingle_set(words: list[str], n: int = 5) -> set[tuple[str, ...]]:
    if len(words) < n:
        return {tuple(words)}
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def set_jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def measure(lang: str, en: list, tr: list, pairs: list) -> list[dict]:
    v2, v3 = SignatureSpec(version=VERSION_V2), SignatureSpec(version=VERSION_V3)
    fe, f2, f3 = fingerprints(en, v2), fingerprints(tr, v2), fingerprints(tr, v3)
    icu = [shingle_set(icu_words(t, lang)) for t in tr]
    char = [is_unspaced(normalise(t)) for t in tr]
    rows = []
    for kind, i, j, label in pairs:
        rows.append(
            {
                "kind": kind,
                "label": label,
                "en": jaccard_sorted(fe[i], fe[j]),
                "v2": jaccard_sorted(f2[i], f2[j]),
                "v3": jaccard_sorted(f3[i], f3[j]),
                "icu": set_jaccard(icu[i], icu[j]),
                "char": char[i] and char[j],
            }
        )
    return rows


def verdicts(rows: list[dict], threshold: float, char_threshold: float, key: str) -> dict:
    """Agreement with the English verdict (all pairs, contested pairs), removals, removals
    whose ICU-word Jaccard is below the floor."""
    agree = removed = low = hard = hard_agree = 0
    for r in rows:
        tau = char_threshold if r["char"] else threshold
        mine, ref = r[key] >= tau, r["en"] >= threshold
        agree += mine == ref
        removed += mine
        low += mine and r["icu"] < WORD_FLOOR
        if max(r[key], r["en"]) >= CONTESTED:
            hard += 1
            hard_agree += mine == ref
    return {
        "agree": agree / len(rows),
        "contested": hard,
        "agree_contested": hard_agree / hard if hard else 1.0,
        "removed": removed,
        "below_floor": low,
    }


def report(lang: str, rows: list[dict], tau: float, char_tau: float, verbose: bool) -> None:
    old = verdicts(rows, tau, tau, "v2")
    cur = verdicts(rows, tau, tau, "v3")
    high = verdicts(rows, tau, char_tau, "v2")
    kinds = {k: sum(r["kind"] == k for r in rows) for k in KINDS}
    ref = sum(r["en"] >= tau for r in rows)
    print(f"\n== {lang}: {len(rows)} pairs {kinds}, English removes {ref}")
    print(f"{'rule':32} {'agree':>6} {'contested':>9} {'agree':>6} {'removed':>7} {'icu<0.7':>7}")
    for name, v in (
        (f"minhash.v2 chars ({tau})", old),
        (f"v2 chars, char mode {char_tau}", high),
        (f"minhash.v3 ICU words ({tau})", cur),
    ):
        print(
            f"{name:32} {v['agree']:6.1%} {v['contested']:9d} {v['agree_contested']:6.1%} "
            f"{v['removed']:7d} {v['below_floor']:7d}"
        )
    for kind in kinds:
        sel = [r for r in rows if r["kind"] == kind]
        if sel:
            med = {k: median(r[k] for r in sel) for k in ("en", "v2", "v3", "icu")}
            print(
                f"  median J {kind:9} en {med['en']:.3f}, {lang} v2 {med['v2']:.3f} "
                f"v3 {med['v3']:.3f} icu {med['icu']:.3f}"
            )
    for r in sorted(rows, key=lambda r: -r["v3"]):
        mine, ref = r["v3"] >= tau, r["en"] >= tau
        if mine != ref and verbose:
            verdict = "removes, English keeps" if mine else "keeps, English removes"
            print(
                f"  v3 {verdict}: {r['label']:24} en {r['en']:.2f} {lang} v3 {r['v3']:.2f} "
                f"(v2 {r['v2']:.2f})"
            )


def calibrate(all_rows: dict[str, list[dict]], threshold: float) -> None:
    """Agreement and floor violations of unspaced-script thresholds, v2 chars and v3 words."""
    rows = [r for lang in ("ja", "zh") for r in all_rows.get(lang, []) if r["char"]]
    print(f"\n== calibration over {len(rows)} pairs of unspaced-script pages (ja+zh)")
    for key in ("v2", "v3"):
        for t in np.arange(0.70, 0.99, 0.02):
            v = verdicts(rows, threshold, float(t), key)
            print(
                f"{key} {t:.2f}: agree {v['agree']:.1%}, contested {v['agree_contested']:.1%} "
                f"of {v['contested']}, removed {v['removed']}, icu<0.7 {v['below_floor']}"
            )


def speed(texts: list[str], pairs: int = 7) -> None:
    """MB/s of v2 and v3 signatures on one language's pages, interleaved (median of pairs)."""
    v2, v3 = SignatureSpec(version=VERSION_V2), SignatureSpec(version=VERSION_V3)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    times: dict[str, list[float]] = {"v2": [], "v3": []}
    for _ in range(pairs):
        for name, spec in (("v2", v2), ("v3", v3)):
            start = time.perf_counter()
            signatures(texts, spec)
            times[name].append(time.perf_counter() - start)
    t2, t3 = median(times["v2"]), median(times["v3"])
    print(
        f"  signatures: v2 {mb / t2:.1f} MB/s, v3 {mb / t3:.1f} MB/s ({mb:.1f} MB): "
        f"v3/v2 {t3 / t2:.2f}x time"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, required=True, help="download/render dir")
    parser.add_argument("--langs", default="ja,zh,fr,de")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--json", type=Path, help="write the per-pair rows here")
    parser.add_argument("--char-threshold", type=float, default=0.9, help="v2 variant shown")
    parser.add_argument("--verbose", action="store_true", help="list v3's disagreements")
    args = parser.parse_args()
    pages = sources(fetch(args.cache))
    tau = float(NearDedupPolicy().threshold)
    all_rows = {}
    for lang in args.langs.split(","):
        en, tr, pairs = build(pages, lang, args.cache)
        all_rows[lang] = measure(lang, en, tr, pairs)
        report(lang, all_rows[lang], tau, args.char_threshold, args.verbose)
        speed(tr)
    if args.calibrate:
        calibrate(all_rows, tau)
    if args.json:
        args.json.write_text(json.dumps(all_rows))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()

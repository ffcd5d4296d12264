"""Inputs of ``test_hot_path_golden``: a spread sample of every shared corpus and adversarial
strings (PII shapes, control and terminal artefacts, scripts, combining marks, NUL, lone
surrogates, long texts past every chunk size) built from a fixed seed, so the digests they give
are a property of the code alone."""

import json
import random

import zstandard

from corpus_assets_tests.paths import CORPORA

# Per corpus: up to this many lines spread evenly, and at most this many bytes of them.
SAMPLE_LINES, SAMPLE_BYTES = 1500, 4_000_000

PIECES = [
    "alice@example.com",
    "Bob.O'Neil+tag@sub.mail.example.co.uk",
    "x@y",
    "@@",
    "mailto:root@localhost",
    "2001:db8::1",
    "2a00:1450:4007:80e::200e",
    "fe80::1%eth0",
    "::ffff:192.0.2.1",
    "2606:4700:4700::1111",
    "1:2:3:4:5:6:7:8",
    "2a03:2880:f12f:83:face:b00c:0:25de",
    "::",
    "a::b::c",
    "8.8.8.8",
    "10.0.0.1",
    "192.168.001.1",
    "v1.2.3.4",
    "version 9.9.9.9",
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "378282246310005",
    "6011111111111117",
    "+44 20 7946 0958",
    "+1 (555) 123-4567",
    "(555) 123-4567",
    "1-800-555-0199",
    "555-123-4567",
    "020 7946 0958",
    "01 23 45 67 89",
    "12345-6789",
    "password: hunter2",
    "password = getpass.getpass()",
    'DB_PASSWORD="s3cr3t!"',
    "api_key=abcdef123456",
    "X-Api-Key: 0123456789abcdef",
    "secret_access_key = " + "A" * 40,
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_" + "a1B2" * 9,
    "xoxb-1234567890-abcdef",
    "sk-" + "Z" * 24,
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
    "https://user:pa55word@host.example/path",
    "PWD=/home/x",
    "sEcReT_AcCeSs_KeY: " + "b" * 40,
    "AKIASECRETACCESSKEY0 secret_access_key=" + "C" * 40,
    "\u0130 password: x \u0130\u0130 api_key=y",
    "api_\u212aey=z",
    "refresh_token: abc auth-token=def apitoken=ghi token=jkl",
    "api-key: 'quoted' apikey=\"dq\" api_key = value",
    "\u03a3\u03a3 PASSWORD=\u03a3",
    "pwd=pwd",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----\nProc-Type: 4\n\nQUJDREVGR0hJSktMTU5PUFFSU1Q=\n",
    "\x1b[31mred\x1b[0m",
    "\x1b]0;title\x07",
    "\x1b[1",
    "\x1b(B",
    "_\bu_\bn",
    "b\bbo\bol\bld\bd",
    "'\be^\bo",
    "\bstart",
    "line\r\nwin\rmac",
    "\x00",
    "\x01\x02\x03\x04\x05",
    "\x07\x0b\x0c",
    "\x85\x9f",
    "e\u0301",
    "A\u030a\u0323",
    "\ufb01 \u1e9e \u0130",
    "жёлтый",
    "日本語のテキスト",
    "中文文本内容",
    "ภาษาไทย",
    "한국어",
    "العربية",
    "עברית",
    "हिन्दी",
    "\U00020000\U0002a6d6",
    "\U0001f600\u200d\U0001f600",
    "\u00a0\u2003\u3000\u200b\ufeff",
    "\u00ad\u034f",
    "\ud800",
    "\udfff\ud83d",
    "if (x) { return y; }",
    "    indented\n\n\n  code  \n",
    "0123456789" * 3,
    "the the the the the",
    " ",
    "\n",
    "\t",
    "...",
    "!!!???",
]


def adversarial_texts(count: int = 600, seed: int = 32) -> list[str]:
    """Every piece alone, then random joins of pieces (with ASCII words between), then a few
    long texts (beyond the 64k normalise/PII chunks, the 128k quality pieces and the 256k
    dedup and MinHash windows)."""
    rng = random.Random(seed)
    words = [
        "the",
        "of",
        "data",
        "file",
        "value",
        "error",
        "code",
        "line",
        "text",
        "page",
        "alpha",
        "beta",
    ]
    seps = [" ", "\n", "", ", ", "\t", "\r\n", ":", "="]
    texts = list(PIECES)
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(1, 12)):
            parts.append(rng.choice(PIECES) if rng.random() < 0.5 else rng.choice(words))
            parts.append(rng.choice(seps))
        texts.append("".join(parts))
    for size in (70_000, 140_000, 300_000):
        parts = []
        while sum(map(len, parts)) < size:
            parts.append(
                rng.choice(PIECES) if rng.random() < 0.2 else " ".join(rng.sample(words, 5))
            )
            parts.append(rng.choice(seps))
        texts.append("".join(parts))
    texts.append("word " * 70_000)  # one long clean text
    texts.append("日本語" * 100_000)  # long unspaced
    return texts


def adversarial_lines(texts: list[str]) -> list[bytes]:
    """JSONL rows of the texts (lone surrogates as escapes), plus rows every parser path and
    adapter error sees."""
    lines = [json.dumps({"id": f"a{n}", "text": t}).encode() for n, t in enumerate(texts)]
    return [
        *lines,
        b"",
        b"   ",
        b"[1, 2]",
        b'{"id": 1, "text": NaN}',
        b'{"id": 2, "text": "x", "n": 123456789012345678901234567890}',
        b'{"id": 3, "text": "\xff\xfe"}',
        b'{"id": 4, "text": 5}',
        b'{"id": true, "text": "bool id"}',
        b'{"text": "no id"}',
        b'{"id": "x", "text": "unterminated',
        b'{"id": 5, "text": "deep", "x": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    ]


def corpus_lines(name: str) -> list[bytes]:
    """Up to ``SAMPLE_LINES`` lines of a shared corpus spread over it, ``SAMPLE_BYTES`` at most."""
    lines: list[bytes] = []
    for path in sorted((CORPORA / name).glob("*.jsonl.zst")):
        lines += zstandard.decompress(path.read_bytes()).splitlines()
    picked, size = [], 0
    for line in lines[:: max(1, len(lines) // SAMPLE_LINES)]:
        if size + len(line) > SAMPLE_BYTES:
            continue
        picked.append(line)
        size += len(line)
    return picked

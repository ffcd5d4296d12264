"""PII redaction stage: rule-based, so it removes only the patterns defined here.

Values are replaced in place by a type placeholder and only per-type counts leave this module,
so neither a log line nor an exclusion row can carry a removed value. Rules run in a fixed order
(secret, email, then payment card / IPv4 / phone in one pass where the first that matches at a
position wins, then IPv6) so a more specific rule takes its characters before a looser one
can; placeholders hold no digit, ``@``, ``:`` or ``-``, so ``redact`` of its own output
changes nothing.

Rules. "Touching" means the neighbouring character; boundaries are ASCII, so a CJK character
next to a number does not hide it.

- ``secret`` ``[SECRET]``: PEM private key blocks (to the END line, or the header and its
  base64/header lines when the END is missing), AWS key ids ``AKIA``/``ASIA`` + 16, the 40-char
  value after ``[aws_]secret_access_key``/``SecretAccessKey`` and ``=``, ``:``, ``=>`` or ``:=``
  (any case, quotes optional; the name stays; never 40 chars without it), GitHub tokens
  ``gh[pousr]_`` + 36 and ``github_pat_``, Slack ``xox[abprs]-``, ``sk-`` + 20 alphanumerics
  (and ``sk-proj-``/``sk-ant-`` style keys), JWT-shaped ``eyJ..eyJ..`` triples; and the value
  after a password, secret, API-key or token name (``password=...``, ``passwd: ...``,
  ``"api_key": "..."``) or in a URL's user-info (``scheme://user:PASSWORD@host``), the name
  kept, prose and code left alone (the rules are ``pii_secrets``'s).
- ``email`` ``[EMAIL]``: ASCII local part ``@`` dotted domain with a 2+ letter TLD.
- ``payment_card`` ``[CARD]``: 13-19 digits, one unbroken run or 4-4-4-x / 4-6-x groups with
  one consistent space or dash, with a card network's prefix and length, Luhn-valid.
- ``ip`` ``[IP]``: globally routable addresses only. IPv4: four decimal octets 0-255 without
  leading zeros; IPv6: 8 groups, or ``::`` with at least 3 explicit groups (so slices like
  ``a[1::2]``, ``::1`` and reST ``::`` never qualify), optional dotted IPv4 tail. Not an
  address: an IPv4 touched on the left by a letter, digit, ``.``, ``letter-`` or a single
  ``/`` (``v2.10.0.1``, ``zlib-1.2.3.4``, ``Firefox/2.0.0.11``; ``http://`` is fine) or on the
  right by a letter, digit or ``.``+alphanumeric (``1.3.6.1.4.1``, ``1.0.0.127.in-addr``), one
  preceded by a version or numbering word (``version 1.2.3.4``, ``Python 3.11.2.1``,
  ``section 8.2.4.4``), and special-purpose ranges (private, loopback, link-local,
  documentation, multicast, reserved, netmasks; IPv6 ``::/16``, ULA, link-local, multicast,
  ``2001::/23``, ``2001:db8::/32``): those identify no one, and code and docs are full of them.
- ``phone`` ``[PHONE]``: ``+CC`` international numbers (7-15 digits), NANP ``(555) 123-4567``
  / ``555-123-4567`` / ``555.123.4567`` / ``1-800-555-0199`` (one consistent separator),
  trunk-0 national numbers with a separator (``020 7946 0958``, ``030/1234567``; 7-13 digits;
  not a US ZIP+4 ``02110-1301``) and French pairs ``01 23 45 67 89``. An unbroken digit run
  without ``+`` is never a phone (ids, timestamps and integers in code look the same); dates
  and versions fail the group shapes.

Speed: every pattern starts with a literal or a character class (so the regex engine skips
ahead at C speed instead of trying each position), lookbehinds come after the first character,
and email and IPv6 are searched from their anchors (``@``, ``::`` or a ``:h:h:`` chain).
"""

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from corpus_assets.core.records.pii_secrets import redact_line_secrets
from corpus_assets.core.records.text_chunks import rewrite_chunks, splice


@dataclass(frozen=True)
class Redaction:
    """Redacted text and how many values of each type were removed (never the values)."""

    text: str
    counts: dict[str, int]


_A = re.ASCII

# Secrets: one pattern per family, each starting with its literal and run only when a cheap
# substring test says the literal is there (all but PEM in ``pii_secrets``).
_PEM = re.compile(
    r"-----BEGIN (?P<label>(?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?)-----"
    r"(?:[\s\S]{0,65536}?-----END (?P=label)-----"
    # no END: the header lines, a blank line only before base64, whole base64 lines
    r"|(?:\r?\n(?:[A-Za-z-]+: [^\r\n]*|[ \t]*(?=\r?\n[A-Za-z0-9+/]{16})"
    r"|[A-Za-z0-9+/=]{4,}(?=[ \t]*(?:\r?\n|\Z))))*)",
    _A,
)
# Email is found from its '@': the domain by regex, the local part by a bounded look back.
_EMAIL_DOMAIN = re.compile(
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![A-Za-z0-9-])", _A
)
_EMAIL_LOCAL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}\Z", _A)
# Payment card, IPv4 and phone in one pass from each digit (a pass costs ~10 ns per digit in
# code, so three passes were the bottleneck). Branch order is rule order; "intl" and "paren"
# start after their '+' / '(' (a class of '+' and '(' would stop at every call in code) and
# get it back in ``_number_spans``. Every branch is guarded on the left by ``(?<![\w.].)``.
_NUMBERS = re.compile(
    r"[0-9](?<![\w.].)(?:"
    r"(?P<card>(?<=[2-6])(?<![+/-].)[0-9]{3}(?:[0-9]{9,15}"
    r"|(?P<s>[ -])[0-9]{4}(?P=s)[0-9]{4}(?P=s)[0-9]{1,4}(?:(?P=s)[0-9]{1,3})?"
    r"|(?P<a>[ -])[0-9]{6}(?P=a)[0-9]{4,5})(?!\w|\.\w|[,-][0-9]))"
    r"|(?P<ipv4>(?<![A-Za-z]-.)(?<![^/]/.)[0-9]{0,2}(?:\.[0-9]{1,3}){3}(?!\w|\.\w))"
    r"|(?P<intl>(?<=\+[1-9])(?<![\w+./=-]\+.)[0-9]{0,2}(?:[ -]?\(0\))?"  # +44 20 7946 0958
    r"(?:[ -]?\(?[0-9]{1,5}\)?){1,6}(?![\w)]|[./-][0-9]))"
    r"|(?P<paren>(?<=\(.)(?<![\w+./=-]\(.)[0-9]{2}\) ?[0-9]{3}[ .-][0-9]{4}"  # (555) 123-4567
    r"(?![\w)]|[./-][0-9]))"
    r"|(?P<phone>(?<![+/=-].)(?:"
    r"(?<=1)[ .-](?:\([0-9]{3}\) ?[0-9]{3}[ .-][0-9]{4}"  # 1-(800) 555-0199
    r"|[0-9]{3}(?P<m>[ .-])[0-9]{3}(?P=m)[0-9]{4})"  # 1-800-555-0199
    r"|[0-9]{2}(?P<n>[ .-])[0-9]{3}(?P=n)[0-9]{4}"  # 555-123-4567
    r"|(?<=0)[1-9][0-9]{0,3}[ /-][1-9][0-9]{2,7}(?:[ -][0-9]{2,4}){0,3}"  # 020 7946 0958
    r"|(?<=0)[1-9](?P<f>[ .-])[0-9]{2}(?:(?P=f)[0-9]{2}){3}"  # 01 23 45 67 89
    r")(?![\w)]|[./-][0-9]))"
    r")",
    _A,
)
_NUMBERED_BEFORE = re.compile(
    r"(?i)(?:\b(?:v|ver|vers|versions?|releases?|rel|rev|revision|build|python|firmware|kernel"
    r"|update|patch|sections?|sect|sec|chapters?|chap|ch|figures?|fig|tables?|steps?|items?"
    r"|parts?|clauses?|paragraphs?|para|appendix|rules?|rfc)|§)[.:=]?[ \t]{0,3}[\"'(\[]?\Z"
)
# Non-global IPv4 ranges (RFC 6890 special purpose: this network, private, shared, loopback,
# link-local, IETF, documentation, benchmarking, multicast + reserved + broadcast): (net, bits).
# fmt: off
_NON_GLOBAL_V4 = (
    (0x00000000, 8), (0x0A000000, 8), (0x64400000, 10), (0x7F000000, 8), (0xA9FE0000, 16),
    (0xAC100000, 12), (0xC0000000, 24), (0xC0000200, 24), (0xC0A80000, 16), (0xC6120000, 15),
    (0xC6336400, 24), (0xCB007100, 24), (0xE0000000, 3),
)
# fmt: on
# Every IPv6 candidate holds '::' or, with 8 groups, a ':h:h:' chain; both start with ':'.
_IPV6_HINT = re.compile(r":(?::|[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:)", _A)
_HEX_RUN_BEFORE = re.compile(r"[0-9A-Fa-f:]{0,39}\Z", _A)
_IPV6 = re.compile(
    r"(?<![\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}"
    r"(?:\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3})?(?![\w:]|\.\w)",
    _A,
)
_ZIP4 = re.compile(r"[0-9]{5}-[0-9]{4}")
_NON_DIGIT = re.compile(r"[^0-9]+")


# Character classes of ASCII for ``_number_starts`` (bit flags; non-ASCII has none).
_DIGIT, _WORD, _DOT, _SPACE_OR_DASH, _PLUS_OR_PAREN, _ONE = 1, 2, 4, 8, 16, 32
_WORD_OR_DOT, _DIGIT_OR_DOT = _DIGIT | _WORD | _DOT, _DIGIT | _DOT
_NUMBER_CLASS = np.array(
    [
        (_DIGIT if chr(c).isdigit() else 0)
        | (_WORD if chr(c).isalpha() or chr(c) == "_" else 0)
        | (_DOT if chr(c) == "." else 0)
        | (_SPACE_OR_DASH if chr(c) in " -" else 0)
        | (_PLUS_OR_PAREN if chr(c) in "+(" else 0)
        | (_ONE if chr(c) == "1" else 0)
        for c in range(128)
    ],
    dtype=np.uint8,
)
_IS_DIGIT = bytes(48 <= b <= 57 for b in range(256))  # bytes.translate to 0/1 (a bool array)
_SCAN_CHARS, _STARTS_CHUNK = 4096, 1 << 20  # below the first ``finditer`` beats numpy
_CHUNK_CHARS = 1 << 16  # a longer text is redacted a chunk at a time (bounded intermediates)


def _luhn(digits: str) -> bool:
    """Luhn checksum: rejects most digit runs that only look like card numbers."""
    total = 0
    for i, char in enumerate(reversed(digits)):
        d = ord(char) - 48
        if i & 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_network(digits: str) -> bool:
    """Whether the number has a card network's prefix and one of its lengths."""
    n, p2, p4 = len(digits), int(digits[:2]), int(digits[:4])
    if digits[0] == "4":
        return n in (13, 16, 19)
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:
        return n == 16
    if p2 in (34, 37):
        return n == 15
    if p2 in (36, 38, 39) or 3000 <= p4 <= 3059:
        return 14 <= n <= 19
    if p2 in (62, 65) or p4 == 6011 or 6440 <= p4 <= 6499 or 3528 <= p4 <= 3589:
        return 16 <= n <= 19
    return p2 in (50, 56, 57, 58) and 13 <= n <= 19


def _is_card(value: str) -> bool:
    """A payment card number: network prefix and length, then Luhn (cheapest test first)."""
    digits = _NON_DIGIT.sub("", value)
    return 13 <= len(digits) <= 19 and _card_network(digits) and _luhn(digits)


def _is_ipv4(text: str, start: int, end: int) -> bool:
    """A globally routable IPv4 at ``text[start:end]`` not preceded by a version/numbering word."""
    address = 0
    for octet in text[start:end].split("."):
        if len(octet) > 1 and octet[0] == "0":
            return False
        value = int(octet)
        if value > 255:
            return False
        address = address << 8 | value
    for net, bits in _NON_GLOBAL_V4:
        if address >> (32 - bits) == net >> (32 - bits):
            return False
    return _NUMBERED_BEFORE.search(text, max(0, start - 24), start) is None


def _is_ipv6(candidate: str) -> bool:
    """A globally routable IPv6 (``ipaddress`` parses it: ``::``, an optional dotted IPv4 tail)
    written with at least three groups when ``::`` stands for the rest.

    Shorter forms (``a::b``, ``::1.2.3.4``) are too common in text that is no address. Routable
    is this rule's table, not ``is_global``, which differs between Python patch releases."""
    if "%" in candidate:  # a scope id (``fe80::1%eth0``) names an interface, not a host
        return False
    try:
        address = int(ipaddress.IPv6Address(candidate))
    except ValueError:
        return False
    written = sum(1 + ("." in part) for part in candidate.split(":") if part)  # IPv4 tail: 2
    if "::" in candidate and written < 3:
        return False
    first, second = address >> 112, address >> 96 & 0xFFFF
    # Not global: ::/16 (unspecified, loopback, mapped), fc00::/7 unique local, fe80::/10 and
    # above (link/site-local, multicast), 2001::/23 IETF with 2001:db8::/32 documentation.
    return not (
        first == 0
        or 0xFC00 <= first <= 0xFDFF
        or first >= 0xFE80
        or (first == 0x2001 and (second < 0x0200 or second == 0x0DB8))
    )


def _is_phone(value: str) -> bool:
    """A phone-shaped match with a phone's digit count (7-15 with ``+``, else 7-13, no ZIP+4)."""
    digits = len(_NON_DIGIT.sub("", value.replace("(0)", "")))
    if value[0] == "+":
        return 7 <= digits <= 15
    return 7 <= digits <= 13 and _ZIP4.fullmatch(value) is None


def _email_spans(text: str) -> list[tuple[int, int, str]]:
    """Email spans, found from each ``@domain`` back to its local part (anchored: fast)."""
    spans: list[tuple[int, int, str]] = []
    for m in _EMAIL_DOMAIN.finditer(text):
        at = m.start()
        # the local part never reaches back into the previous address
        local = _EMAIL_LOCAL.search(text, max(0, at - 64, spans[-1][1] if spans else 0), at)
        if local is not None:
            spans.append((local.start(), m.end(), "[EMAIL]"))
    return spans


def _ipv6_spans(text: str) -> list[tuple[int, int, str]]:
    """IPv6 spans, searched from ``::`` or ``:h:h:`` hints rather than at every position."""
    spans: list[tuple[int, int, str]] = []
    pos = 0
    while (hint := _IPV6_HINT.search(text, pos)) is not None:
        at = hint.start()
        start = _HEX_RUN_BEFORE.search(text, max(0, at - 39), at)
        m = _IPV6.match(text, start.start() if start else at)
        if m is not None and m.end() > at and _is_ipv6(m.group()):
            spans.append((m.start(), m.end(), "[IP]"))
            pos = m.end()
        else:
            pos = at + 1
    return spans


_PLACEHOLDER = dict(card="[CARD]", ipv4="[IP]", intl="[PHONE]", paren="[PHONE]", phone="[PHONE]")
_KIND = {"[EMAIL]": "email", "[CARD]": "payment_card", "[IP]": "ip", "[PHONE]": "phone"}
_EMAIL, _IP = _KIND["[EMAIL]"], _KIND["[IP]"]  # count labels, one spelling each


def _number_spans(text: str) -> list[tuple[int, int, str]]:
    """Card, IPv4 and phone spans in one pass: the first rule matching at a position wins.

    A long text tries the pattern only at :func:`_number_starts` (what ``finditer`` would find:
    no other position can start a match), since the regex engine's own scan for a starting
    digit runs at ~100 MB/s and numpy finds the few candidates ~10x faster.
    """
    spans: list[tuple[int, int, str]] = []
    if len(text) < _SCAN_CHARS:
        for m in _NUMBERS.finditer(text):
            _number_span(text, m, spans)
        return spans
    end = 0
    match = _NUMBERS.match
    for start in _number_starts(text):
        if start >= end and (m := match(text, start)) is not None:
            end = m.end()
            _number_span(text, m, spans)
    return spans


def _number_span(text: str, m: re.Match[str], spans: list[tuple[int, int, str]]) -> None:
    """Append the span of a ``_NUMBERS`` match if its rule's check passes."""
    kind = m.lastgroup
    start, end = m.span()
    if kind == "card":
        ok = _is_card(text[start:end])
    elif kind == "ipv4":
        ok = _is_ipv4(text, start, end)
    else:
        if kind != "phone":
            start -= 1  # the '+' or '(' the match starts after
        ok = _is_phone(text[start:end])
    if ok:
        spans.append((start, end, _PLACEHOLDER[kind]))


def _number_starts(text: str) -> Iterator[int]:
    """Every position where ``_NUMBERS`` can match, ascending: an ASCII digit not preceded by
    ``[A-Za-z0-9_.]``, followed by a digit or ``.`` (card, IPv4, phone), or ``1`` followed by
    `` `` or ``-`` (``1-800``), or preceded by ``+`` or ``(`` (international, ``(555)``).
    Beyond either end of the text is class 0, as the pattern's look-arounds see it. Done a
    ``_STARTS_CHUNK`` at a time: a long text's UTF-32 whole was 4 bytes per character, twice."""
    for first in range(0, len(text), _STARTS_CHUNK):
        end, lo = min(first + _STARTS_CHUNK, len(text)), max(first - 1, 0)
        yield from _segment_starts(text[lo : end + 1], first - lo, end - lo, lo)


def _segment_starts(segment: str, first: int, end: int, offset: int) -> list[int]:
    """``_number_starts`` of ``segment[first:end]`` (+ ``offset``); the rest is context."""
    if segment.isascii():
        raw = segment.encode("ascii")
        digits = np.frombuffer(raw.translate(_IS_DIGIT), dtype=np.bool_).nonzero()[0]
        codes = np.frombuffer(raw, dtype=np.uint8)
    else:
        codes = np.frombuffer(segment.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        digits = ((codes - 48) < 10).nonzero()[0]
    digits = digits[(digits >= first) & (digits < end)]
    if not digits.size:
        return []
    last = codes.size - 1
    here = _NUMBER_CLASS[codes[digits]]
    before = _NUMBER_CLASS[np.minimum(codes[digits - 1], 127)]
    before[digits == 0] = 0
    after = _NUMBER_CLASS[np.minimum(codes[np.minimum(digits + 1, last)], 127)]
    after[digits == last] = 0
    starts = ((before & _WORD_OR_DOT) == 0) & (
        ((after & _DIGIT_OR_DOT) != 0)
        | (((here & _ONE) != 0) & ((after & _SPACE_OR_DASH) != 0))
        | ((before & _PLUS_OR_PAREN) != 0)
    )
    return (digits[starts] + offset).tolist()


def redact(text: str) -> Redaction:
    """``text`` with every value the rules recognise replaced by its type's placeholder."""
    return Redaction(*redact_parts(text))


def redact_parts(text: str) -> tuple[str, dict[str, int]]:
    """``redact`` as ``(text, counts)``: the per-record path builds no object."""
    counts: dict[str, int] = {}
    if len(text) > _CHUNK_CHARS:
        return _redact_long(text)
    if "-----BEGIN " in text:
        text, n = _PEM.subn("[SECRET]", text)
        if n:
            counts["secret"] = n
    return _redact_lines(text, counts, _IP), counts


def _redact_long(text: str) -> tuple[str, dict[str, int]]:
    """``redact_parts`` a newline-cut chunk at a time (every rule after PEM stays within a
    line; PEM blocks are found in the whole text and never cut); counts in the same order."""
    pem = [(*m.span(), "[SECRET]") for m in _PEM.finditer(text)] if "-----BEGIN " in text else []
    total = {"secret": len(pem)} if pem else {}

    def rewrite(chunk: str) -> str | None:
        found = sum(total.values())
        new = _redact_lines(chunk, total, "ipv6")
        return new if sum(total.values()) > found else None

    text = rewrite_chunks(text, _CHUNK_CHARS, rewrite, pem)
    counts = {k: total[k] for k in ("secret", _EMAIL) if k in total}
    counts.update((k, n) for k, n in total.items() if k not in ("secret", _EMAIL, "ipv6"))
    if "ipv6" in total:
        counts[_IP] = counts.get(_IP, 0) + total["ipv6"]
    return text, counts


def _redact_lines(text: str, counts: dict[str, int], ipv6: str) -> str:
    """Every rule but PEM (none crosses a line), counting by type (IPv6 under ``ipv6``)."""
    text, secrets = redact_line_secrets(text)
    if secrets:
        counts["secret"] = counts.get("secret", 0) + secrets
    if "@" in text and (spans := _email_spans(text)):
        text = splice(text, spans)
        counts[_EMAIL] = counts.get(_EMAIL, 0) + len(spans)
    if spans := _number_spans(text):
        text = splice(text, spans)
        for _, _, placeholder in spans:
            kind = _KIND[placeholder]
            counts[kind] = counts.get(kind, 0) + 1
    if ":" in text and (spans := _ipv6_spans(text)):
        text = splice(text, spans)
        counts[ipv6] = counts.get(ipv6, 0) + len(spans)
    return text

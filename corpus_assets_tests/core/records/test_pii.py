"""PII redaction: every type is redacted, near misses are not, and redaction is idempotent.

Token-shaped test values are assembled at run time so no secret-looking literal sits in the
repository for scanners to flag.
"""

import json
import re

import pytest
import zstandard

from corpus_assets.core.records import pii
from corpus_assets.core.records.pii import Redaction, redact, redact_parts
from corpus_assets.core.runtime.code_identity import PACKAGE_ROOT, _closure
from corpus_assets_tests.paths import CORPORA

CORPORA = CORPORA

GITHUB_TOKEN = "gh" + "p_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
SLACK_TOKEN = "xo" + "xb-" + "1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx"
OPENAI_KEY = "s" + "k-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv"
JWT = (
    "ey" + "JhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".ey" + "JzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PEM = (
    "-----BEGIN RSA " + "PRIVATE KEY-----\n"
    "MIIEpAIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgwMbRvI0MBZhpF\n"
    "-----END RSA PRIVATE KEY-----"
)

# (type, value as written in running text, placeholder)
REDACTED = [
    ("email", "john.doe+news@example.co.uk", "[EMAIL]"),
    ("email", "wirzeniu@cs.helsinki.fi", "[EMAIL]"),  # from a fortune's attribution
    ("phone", "+44 20 7946 0958", "[PHONE]"),
    ("phone", "+1 (555) 123-4567", "[PHONE]"),
    ("phone", "+49 (0)30 1234567", "[PHONE]"),
    ("phone", "+4930123456", "[PHONE]"),
    ("phone", "(713) 438-5018", "[PHONE]"),  # a fortune's BBS number
    ("phone", "1-415-642-4948", "[PHONE]"),  # another fortune
    ("phone", "212-555-0147", "[PHONE]"),
    ("phone", "212.555.0147", "[PHONE]"),
    ("phone", "020 7946 0958", "[PHONE]"),
    ("phone", "030/1234567", "[PHONE]"),
    ("phone", "01 23 45 67 89", "[PHONE]"),
    ("ip", "81.2.69.142", "[IP]"),
    ("ip", "194.109.137.218", "[IP]"),
    ("ip", "2a00:1450:4001:82b::200e", "[IP]"),
    ("ip", "2606:2800:220:1:248:1893:25c8:1946", "[IP]"),
    ("payment_card", "4111 1111 1111 1111", "[CARD]"),
    ("payment_card", "4111-1111-1111-1111", "[CARD]"),
    ("payment_card", "5555555555554444", "[CARD]"),
    ("payment_card", "3782 822463 10005", "[CARD]"),
    ("payment_card", "6011 1111 1111 1117", "[CARD]"),
    ("secret", "AKIA" + "IOSFODNN7EXAMPLE", "[SECRET]"),
    ("secret", GITHUB_TOKEN, "[SECRET]"),
    ("secret", SLACK_TOKEN, "[SECRET]"),
    ("secret", OPENAI_KEY, "[SECRET]"),
    ("secret", JWT, "[SECRET]"),
    ("secret", PEM, "[SECRET]"),
]


@pytest.mark.parametrize(("kind", "value", "placeholder"), REDACTED)
def test_each_type_is_redacted(kind: str, value: str, placeholder: str) -> None:
    text = f"Contact: {value}, thanks.\n"
    result = redact(text)
    assert result == Redaction(f"Contact: {placeholder}, thanks.\n", {kind: 1})
    assert value not in repr(result)
    assert redact(result.text) == Redaction(result.text, {})


def test_counts_carry_only_counts() -> None:
    text = "mail a@example.org or b@example.org, card 4111111111111111, ip 81.2.69.142"
    result = redact(text)
    assert result.counts == {"email": 2, "payment_card": 1, "ip": 1}
    assert all(isinstance(n, int) for n in result.counts.values())
    assert result.text == "mail [EMAIL] or [EMAIL], card [CARD], ip [IP]"


def test_pem_without_end_takes_header_and_base64_lines() -> None:
    text = (
        "key:\n-----BEGIN " + "PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"
        "BKcwggSjAgEAAoIBAQC7\n\nNext paragraph."
    )
    assert redact(text) == Redaction("key:\n[SECRET]\n\nNext paragraph.", {"secret": 1})


def test_boundaries_keep_surrounding_punctuation() -> None:
    assert redact("<a.b@example.org>.").text == "<[EMAIL]>."
    assert redact("to a@example.org,b@example.net;").text == "to [EMAIL],[EMAIL];"
    assert redact("(81.2.69.142)").text == "([IP])"
    assert redact("http://81.2.69.142/path").text == "http://[IP]/path"
    assert redact("[2a00:1450:4001:82b::200e]:443").text == "[[IP]]:443"
    assert redact("地址是81.2.69.142。").text == "地址是[IP]。"  # CJK is not a word boundary


NOT_REDACTED = [
    # payment-card-shaped numbers that fail Luhn or a network's prefix/length
    "4111 1111 1111 1112",
    "Your lucky number is 3552664958674928.  Watch for it everywhere.",  # a fortune
    "In-Reply-To: <20110813065417.GV2324@host>",  # a message id's timestamp, Luhn-valid
    # versions, OIDs and section numbers that look like IPv4
    "version 1.2.3.4",
    "v2.10.0.1",
    "Python 3.11.2.1 and release 10.20.30.40",
    "see section 8.2.4.44",
    "Firefox/2.0.0.11 and zlib-1.2.3.4",
    "OID 1.3.6.1.4.1.311",
    "256.1.1.1 and 01.02.03.04",
    # special-purpose addresses identify no one
    "127.0.0.1 localhost, 192.168.11.100, 10.0.0.1, 255.255.255.0, 0.0.0.0",
    "2001:db8::1 and ::1 and fe80::1ff:fe23:4567:890a and ::ffff:0:0",
    # dates and times
    "2023-01-15, 15.01.2023, 01/15/2023, 2023 01 15, 12:30:45, Mon Oct 27 23:02:09 2003",
    # ISBN-like numbers
    "ISBN 978-0-306-40615-7, ISBN 0-306-40615-2, ISBN 9780306406157, ISBN 0306406152",
    # postal codes
    "51 Franklin Street, Fifth Floor, Boston, MA 02110-1301 USA",
    # plain integers in code, slices, hex, MAC addresses
    "x = 12345678901234567890\nMAX = 9223372036854775807\nTIMEOUT_MS = 1700000000000\n",
    "user_id = 5551234567\nphone = int('5551234567')\nf(5551234567)\n",
    "digits = '0123456789'\nmask = 0x0012345678\nb = a[1::2] + a[::-1]\n",
    "mac 00:1a:2b:3c:4d:5e, reST literal::\n",
    "Decimal('+35236450.6') and '+3.140000'",
    # look-alikes of the secret and email shapes
    "task-learning and sk-learn, AKIA in a word: XAKIAIOSFODNN7EXAMPLEX",
    "@property\ndef f(self): return a@b.T",
    "user@localhost",
]


@pytest.mark.parametrize("text", NOT_REDACTED)
def test_near_misses_are_not_redacted(text: str) -> None:
    assert redact(text) == Redaction(text, {})


def test_empty_and_placeholders_are_stable() -> None:
    assert redact("") == Redaction("", {})
    text = "[EMAIL] [PHONE] [IP] [CARD] [SECRET]"
    assert redact(text) == Redaction(text, {})


def test_redaction_is_idempotent_on_everything_above() -> None:
    for text in [f"{value} / {value}" for _, value, _ in REDACTED] + NOT_REDACTED:
        once = redact(text).text
        assert redact(once) == Redaction(once, {})


def test_real_fortunes_corpus() -> None:
    """Redaction over the real fortunes is idempotent and leaves no email-shaped value."""
    shards = sorted((CORPORA / "fortunes").glob("*.jsonl.zst"))
    if not shards:
        pytest.skip(f"shared corpora not present at {CORPORA}")
    email = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
    totals: dict[str, int] = {}
    for shard in shards:
        with shard.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
            lines = reader.read().decode("utf-8").splitlines()
        for line in lines:
            result = redact(json.loads(line)["text"])
            for kind, n in result.counts.items():
                totals[kind] = totals.get(kind, 0) + n
            assert email.search(result.text) is None
            assert redact(result.text).counts == {}
    assert totals.get("email", 0) > 300  # Usenet-era attributions
    assert totals.get("payment_card", 0) == 0


AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"  # AWS's documented example, 40


@pytest.mark.parametrize(
    "shape",
    [
        "aws_secret_access_key = {}",  # ~/.aws/credentials (INI)
        "export AWS_SECRET_ACCESS_KEY={}",  # env
        'AWS_SECRET_ACCESS_KEY="{}"',
        "  secret_access_key: '{}'",  # YAML
        '{{"aws_secret_access_key": "{}", "region": "eu-west-1"}}',  # JSON
        '"SecretAccessKey" : "{}"',  # `aws sts` JSON output
        "boto3.client('s3', aws_secret_access_key='{}')",
        'os.environ["AWS_SECRET_ACCESS_KEY"] = "{}"',
        "aws_secret_access_key => {}",
    ],
)
def test_an_aws_secret_after_its_name_is_redacted(shape: str) -> None:
    text, counts = redact_parts(shape.format(AWS_SECRET))
    assert AWS_SECRET not in text and "[SECRET]" in text and counts == {"secret": 1}
    assert "secret" in text.replace("[SECRET]", "").lower()  # only the value goes
    assert redact_parts(text) == (text, {})


@pytest.mark.parametrize(
    "text",
    [
        f"checksum = {AWS_SECRET}",  # 40 base64 characters without the key's name
        f"data = '{AWS_SECRET}'  # secret",
        f"aws_secret_access_key = {AWS_SECRET}A",  # 41: not an AWS secret
        f"aws_secret_access_key = {AWS_SECRET[:39]}",
        "aws_secret_access_key = os.environ['AWS_SECRET_ACCESS_KEY']",
        "SECRET_ACCESS_KEY_LENGTH = 40",
    ],
)
def test_forty_characters_without_the_aws_secret_name_stay(text: str) -> None:
    assert redact_parts(text) == (text, {})


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_number_starts_by_chunks_are_the_whole_texts(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long text's number scan runs a chunk at a time; chunk edges change no start, so the
    spans equal ``finditer``'s on the whole text (ASCII and not, digits at every edge)."""
    for text in (
        "call +44 20 7946 0958 or 555-123-4567, card 4111 1111 1111 1111; v1.2.3.4 8.8.8.8 (555) 1",
        "電話 +81 3-1234-5678、ＩＰ 8.8.4.4 と 1-800-555-0199 ½ 4111111111111111 x9 12",
    ):
        whole = [m.start() for m in pii._NUMBERS.finditer(text)]
        monkeypatch.setattr(pii, "_STARTS_CHUNK", chunk)
        starts = list(pii._number_starts(text))
        assert set(whole) <= set(starts) and starts == sorted(set(starts))
        matched = [s for s in starts if pii._NUMBERS.match(text, s)]
        assert [m for m in matched if m in whole] == whole
        monkeypatch.setattr(pii, "_SCAN_CHARS", 0)  # the chunked path for these short texts
        assert pii._number_spans(text) == _finditer_spans(text)
        monkeypatch.undo()


def _finditer_spans(text: str) -> list[tuple[int, int, str]]:
    spans: list[tuple[int, int, str]] = []
    for m in pii._NUMBERS.finditer(text):
        pii._number_span(text, m, spans)
    return spans


# Key-value secrets: the value after a password/secret/API-key/token name goes, the
# name and the quoting stay. Each: (line as it appears in real files, the line redacted).
KEY_VALUE = [
    ("password=hunter2", "password=[SECRET]"),
    ("export DB_PASSWORD=s3cr3t!", "export DB_PASSWORD=[SECRET]"),
    ("MYSQL_PWD='p@ss w0rd' mysql -u root", "MYSQL_PWD='[SECRET]' mysql -u root"),
    ("mysql -u root --password=hunter2 shop", "mysql -u root --password=[SECRET] shop"),
    ("  passwd: hunter2", "  passwd: [SECRET]"),
    ("password: hunter2   # change me", "password: [SECRET]   # change me"),
    ('  password: "correct horse battery staple"', '  password: "[SECRET]"'),
    ('{"user": "bob", "password": "hunter2"}', '{"user": "bob", "password": "[SECRET]"}'),
    ("client_secret = 'Zx9-Qw8_Er7'", "client_secret = '[SECRET]'"),
    ("secret=sauce42 ./run.sh", "secret=[SECRET] ./run.sh"),
    ("spring.datasource.password = tiger!42", "spring.datasource.password = [SECRET]"),
    ("GET /cb?code=7&api_key=AbC123xyz&page=2", "GET /cb?code=7&api_key=[SECRET]&page=2"),
    ('headers = {"X-Api-Key": "k-93jf83j"}', 'headers = {"X-Api-Key": "[SECRET]"}'),
    ("access_token: ya29.a0AfH6SM", "access_token: [SECRET]"),
    ("passphrase => 'open sesame'", "passphrase => '[SECRET]'"),
    (f"secret_key = {AWS_SECRET}", "secret_key = [SECRET]"),
    (
        "postgresql://bob:hunter2@db.example.com:5432/shop",
        "postgresql://bob:[SECRET]@db.example.com:5432/shop",
    ),
    ("s3://AKID:wJalr%2Fxyz@bucket/key", "s3://AKID:[SECRET]@bucket/key"),
]


@pytest.mark.parametrize(("line", "redacted"), KEY_VALUE)
def test_a_key_value_secret_keeps_its_key(line: str, redacted: str) -> None:
    assert redact_parts(line) == (redacted, {"secret": 1})
    assert redact_parts(redacted) == (redacted, {})


KEY_VALUE_KEPT = [
    "Enter the password field and press return.",
    "Behind the wall there was a secret garden.",
    "The password: is asked for twice, then stored.",
    "Passwords: see the administrator's guide.",
    "passwd: Authentication token manipulation error",
    "password: none",
    "def login(user: str, password: str) -> bool:",
    "    password: str",
    "if password == stored and token != other:",
    "password = getpass.getpass()",
    "password = os.environ['DB_PASSWORD']",
    "token = next(tokens)",
    'password = ""',
    "password=$DB_PASSWORD pwd=$(pwd) secret=${SECRET} api_key=<your key> password=%s",
    "PWD=/home/bob OLDPWD=/tmp",
    "mypassword=x and passwordHash=abc",
    "https://example.com:8443/path?page=2 and ftp://ftp.example.com:21/pub",
    "postgresql://${USER}:${PASSWORD}@db/shop",
]


@pytest.mark.parametrize("text", KEY_VALUE_KEPT)
def test_prose_code_and_placeholders_keep_their_words(text: str) -> None:
    assert redact_parts(text) == (text, {})


def test_the_python_stdlib_keeps_its_code() -> None:
    """The real standard library (getpass, smtplib, ftplib, zipfile, urllib) names passwords all
    over - ``pwd=None``, ``passwd=passwd``, ``password = getpass.getpass()`` - and keeps every
    one; only its two literal example passwords go (a docstring's ``password: sekrit`` and a
    ``passwd='kadidd!ehopper'`` argument)."""
    shards = sorted((CORPORA / "python-stdlib").glob("*.jsonl.zst"))
    if not shards:
        pytest.skip(f"shared corpora not present at {CORPORA}")
    shapes: set[str] = set()
    for shard in shards:
        with shard.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
            lines = reader.read().decode("utf-8").splitlines()
        for line in lines:
            text, _counts = redact_parts(json.loads(line)["text"])
            shapes.update(m.group().strip() for m in re.finditer(r".*\[SECRET\].*", text))
    assert shapes == {"password: [SECRET]", "passwd='[SECRET]')"}


def test_the_secret_rules_are_in_the_canonical_code_identity() -> None:
    """Redaction changes record bytes: the rules' module is in the canonical stage's import
    closure, so editing it re-runs canonical chunks (``runtime/code_identity``)."""
    closure = _closure("corpus_assets.core.records.canonical_records", PACKAGE_ROOT)
    assert "corpus_assets/core/records/pii_secrets.py" in closure

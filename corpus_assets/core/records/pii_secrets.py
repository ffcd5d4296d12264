"""The ``secret`` rules of PII redaction that stay within a line (``pii`` runs PEM blocks
itself): token shapes, and values after a name that says they are secret.

Key-value secrets. A name - ``password``, ``passwd``, ``passphrase``, ``pwd``,
``secret``, ``secret_key``, ``api_key``/``apikey``/``api-key``, ``access_token``,
``auth_token``, ``refresh_token``, ``api_token``, any case, alone or at the end of a dotted,
dashed or underscored name (``DB_PASSWORD``, ``spring.datasource.password``, ``X-Api-Key``,
``--password``; never glued to a letter: ``mypassword``, ``passwordHash``) - then ``=``, ``:``,
``=>`` or ``:=``, then the value. The value goes, the name and quotes stay:

- quoted (``"..."`` or ``'...'``, one line, not blank): the quoted text, unless code continues
  from the closing quote (``' '.join(...)``, ``'%s' % x``);
- ``name=value`` (nothing around ``=``: shell, env, URL query, command line): one token, up to
  white space, ``&``, ``;``, ``,``, ``#`` or a bracket; a value naming a password itself
  (``pwd=pwd``, ``password=self.password``: keyword arguments in code) stays;
- ``name = value`` / ``name: value`` unquoted (INI, YAML, headers): only when the token is the
  rest of the line (an optional ``# comment`` aside), so prose ("The password: is asked for
  twice") keeps its words; after ``=`` with spaces, an identifier, attribute, call or subscript
  (``password = getpass.getpass()``, ``token = next(tokens)``) is code and stays.

Never a value: empty, a placeholder or variable (starting with ``$ < { % * [ (``), a type or
null word (``str``, ``none``, ``null``, ...), and ``PWD=`` without a prefix (the shell's working
directory). A URL's user-info password (``scheme://user:PASSWORD@host``) goes as well, unless it
is a template. Known gaps: an unquoted ``password = hunter2`` looks like code and stays; a
secret under another name (``key=``, ``auth=``) stays.
"""

import re

_A = re.ASCII
_AWS = re.compile(r"A(?<![A-Za-z0-9]A)(?:KIA|SIA)[0-9A-Z]{16}(?![A-Za-z0-9])", _A)
_AWS_SECRET = re.compile(
    r"(?P<name>(?i:secret_?access_?key)[\"']?\]?[ \t]*(?:=>|:=|[=:])[ \t]*[\"']?)"
    r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
    _A,
)
_GITHUB = re.compile(
    r"g(?<![A-Za-z0-9_]g)(?:h[pousr]_[A-Za-z0-9]{36,251}|ithub_pat_[A-Za-z0-9_]{22,244})"
    r"(?![A-Za-z0-9_])",
    _A,
)
_GITHUB_HINT = re.compile(r"gh[pousr]_|github_pat_", _A)
_SLACK = re.compile(r"xox[abprs]-(?<![A-Za-z0-9_-]xox.-)[A-Za-z0-9-]{10,}", _A)
_SK = re.compile(
    r"sk-(?<![A-Za-z0-9_-]sk-)(?:[A-Za-z0-9]{20,}|(?:proj|ant|svcacct|admin)-[A-Za-z0-9_-]{20,})",
    _A,
)
_JWT = re.compile(
    r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*"
    r"(?![A-Za-z0-9_-])",
    _A,
)
_KEY_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?P<key>(?i:pass(?:w(?:or)?d|phrase)|pwd|secret(?:[_-]?key)?"
    r"|api[_-]?(?:key|token)|(?:access|auth|refresh)[_-]?token))[\"']?"
    r"(?P<sep>[ \t]*(?:=>|:=|=(?!=)|:)[ \t]*)"
    r"(?:(?:\"(?P<dq>[^\"\r\n]{1,256})\"|'(?P<sq>[^'\r\n]{1,256})')(?![.\[(%+])"
    r"|(?P<bare>[^\s\"'&;,#()\[\]{}<>]{1,256}))",
    _A,
)
_KEY_HINT = ("pass", "pwd", "secret", "api", "token")
# A key starts with "pass", "pwd", "secret", one of these, or a token prefix.
_API_KEYS = ("api_k", "api-k", "apik")
_PREFIX_ENDS = "_-shi"  # the last character of ``_TOKEN_PREFIX``'s match: [_-], acces(s) ...
_TOKEN_PREFIX = re.compile(r"(?:access|auth|refresh|api)[_-]?\Z", _A)  # before ``token``
# From the literal ``://`` (a fast scan), the scheme checked behind it by ``_SCHEME``.
_URL_PASSWORD = re.compile(r"://[^\s:/@?#\[\]]{1,128}:(?P<value>[^\s/@?#\[\]]{1,256})@", _A)
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,15}\Z", _A)
_NULL_WORDS = ("none", "null", "nil", "true", "false", "yes", "no", "empty", "required")
_NOT_A_VALUE = frozenset((*_NULL_WORDS, "optional", "str", "string", "bytes", "int", "any"))
_CODE = re.compile(r"[A-Za-z_][\w.]*(?:\(.*\)|\[.*\])?\Z", _A)
_REST_OF_LINE = re.compile(r"[ \t]*(?:#[^\r\n]*)?(?:\r?\n|\Z)", _A)
_PLACEHOLDER_START = tuple("$<{%*[(")


def redact_line_secrets(text: str) -> tuple[str, int]:
    """``text`` with every line-local secret replaced by ``[SECRET]``, and how many.

    Each rule runs only where its literal is in the text; the lower-cased copy the key names
    are found in also rules out the secret-key rule and the ``secret`` key (``ecret`` in it is
    necessary for ``ecret`` or ``ECRET`` in the text), and ``IA`` rules out both AWS key
    prefixes: a text without secrets costs fewer passes (each ``in`` or ``find`` is one, ~1.3
    GB/s). The copy is taken again only after a replacement."""
    secrets = 0
    lowered = text.lower()
    if "IA" in text and ("AKIA" in text or "ASIA" in text):
        text, n = _AWS.subn("[SECRET]", text)
        secrets += n
    secret = "ecret" in lowered
    if secret and ("ecret" in text or "ECRET" in text):
        text, n = _AWS_SECRET.subn(r"\g<name>[SECRET]", text)  # the name says what was there
        secrets += n
    if "_" in text and _GITHUB_HINT.search(text):
        text, n = _GITHUB.subn("[SECRET]", text)
        secrets += n
    if "xox" in text:
        text, n = _SLACK.subn("[SECRET]", text)
        secrets += n
    if "sk-" in text:
        text, n = _SK.subn("[SECRET]", text)
        secrets += n
    if "eyJ" in text:
        text, n = _JWT.subn("[SECRET]", text)
        secrets += n
    if secrets:  # a placeholder took some text's place
        lowered = text.lower()
        secret = "ecret" in lowered
    text, n = _key_values(text, lowered, secret)
    return text, secrets + n


def _key_values(text: str, lowered: str, secret: bool = True) -> tuple[str, int]:
    """Key-value and URL user-info passwords (the module docstring's rules); ``lowered`` is
    ``text.lower()``, ``secret=False`` says ``ecret`` is not in it."""
    spans: list[tuple[int, int]] = []
    if "://" in text and "@" in text:
        for m in _URL_PASSWORD.finditer(text):
            scheme = _SCHEME.search(text, max(0, m.start() - 16), m.start())
            if scheme is not None and not _placeholder(m.group("value")):
                spans.append(m.span("value"))
    end = 0
    match = _KEY_VALUE.match
    for start in _key_starts(lowered, secret):
        if start < end or (m := match(text, start)) is None:
            continue
        end = m.end()
        group = next(g for g in ("dq", "sq", "bare") if m.group(g) is not None)
        if _is_secret(m, group):
            spans.append(m.span(group))
    if not spans:
        return text, 0
    pieces, last = [], 0
    for start, end in sorted(spans):
        if start >= last:  # a URL's password may also follow a key name: replaced once
            pieces += [text[last:start], "[SECRET]"]
            last = end
    return "".join([*pieces, text[last:]]), len(pieces) // 2


def _key_starts(lowered: str, secret: bool = True) -> list[int]:
    """Where a key can start, ascending: ``str.find`` of a few stems runs at memory speed (a
    regex alternation tried at every position ran at ~10 MB/s); a ``token`` key starts at its
    ``access``/``auth``/``refresh``/``api`` prefix.

    Each find is a pass over the text, so there are few: ``api`` once, its three key forms
    told apart at each hit; ``secret`` only when the caller saw ``ecret`` (``secret=False``);
    a ``token`` hit is tried only after a character its prefix can end with."""
    starts: list[int] = []
    find = lowered.find
    for stem in ("pass", "pwd", "secret") if secret else ("pass", "pwd"):
        at = find(stem)
        while at >= 0:
            starts.append(at)
            at = find(stem, at + 1)
    at = find("api")
    while at >= 0:
        if lowered.startswith(_API_KEYS, at):
            starts.append(at)
        at = find("api", at + 1)
    at = find("token")
    while at >= 0:
        if (
            at
            and lowered[at - 1] in _PREFIX_ENDS
            and (prefix := _TOKEN_PREFIX.search(lowered, max(0, at - 8), at)) is not None
        ):
            starts.append(prefix.start())
        at = find("token", at + 1)
    return sorted(set(starts))


def _placeholder(value: str) -> bool:
    """A template, variable or a value already redacted, not a secret."""
    return value.startswith(_PLACEHOLDER_START) or value.lower() in _NOT_A_VALUE


def _is_secret(m: re.Match[str], group: str) -> bool:
    """Whether the matched value is a secret by the rules (not code, prose or a placeholder)."""
    if _placeholder(m.group(group)):
        return False
    if m.group("key") == "PWD" and m.string[m.start() - 1 : m.start()] not in ("_", "-", "."):
        return False  # the shell's working directory, not MYSQL_PWD
    value = m.group(group)
    if group != "bare":
        return not value.isspace()
    if _CODE.match(value) and any(hint in value.lower() for hint in (*_KEY_HINT, "key")):
        return False  # ``pwd=pwd``, ``password=self.password``: a variable named after it
    sep = m.group("sep")
    if sep == "=":
        return True
    if _REST_OF_LINE.match(m.string, m.end()) is None:
        return False  # more words follow: prose, or code continuing the line
    return not (sep.strip() == "=" and _CODE.match(value))

"""The tokenizer as an input by digest: ``TokenizerSpec``, resolved from ``policies.tokenizer``.

``utf8-bytes-v1`` needs no file: token = UTF-8 byte (0-255), ``<eos>`` 256, ``<pad>`` 257 and
``<bos>`` 258 (prepended only when declared); its vocabulary is those 259 ids and its fixed name
stands where a file digest would. A Hugging Face tokenizer is a ``tokenizer.json`` named by path
and/or digest: resolving pins the file's exact bytes into the CAS (so ``sha256sum`` of the file
is its digest), checks that the declared special tokens are in its vocabulary and reads the
vocabulary size, which decides the token dtype (uint16 up to 65,536 ids, else uint32). Token
caches, layer indexes and the manifest name the tokenizer by that digest, never by path.

The spec also carries the chat template that renders ``messages`` and ``preference`` records
(``chat_template``; the shipped default unless a caller pins another): its digest is part of
``token_key``, so another template never reuses cached tokens. ``document()`` (the manifest's
``corpus.tokenizer.v1``) does not list it; ``chat_template.document()`` is its record.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from corpus_assets.core.runtime.config import UTF8_SPECIALS, TokenizerPolicy
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import JSON, Ref, make_ref
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.digests import sha256_digest
from corpus_assets.core.tokens.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate

UTF8_BYTES = "utf8-bytes-v1"
HUGGINGFACE = "huggingface"
UTF8_IDS = {"eos": 256, "pad": 257, "bos": 258}
UTF8_VOCAB = 259
SPEC_SCHEMA = "corpus.tokenizer.v1"
_LOADED: dict[tuple[str, str], Tokenizer] = {}  # (CAS root, digest) -> parsed tokenizer


class TokenizerError(ValueError):
    """The configured tokenizer cannot be used; the message names the file, digest or token."""


@dataclass(frozen=True)
class Special:
    token: str
    id: int


@dataclass(frozen=True)
class TokenizerSpec:
    """What a token stream depends on: the tokenizer (by digest), its specials and size."""

    kind: str
    digest: str  # sha256 of the tokenizer.json, or the fixed name utf8-bytes-v1
    file: Ref | None  # the pinned tokenizer.json (huggingface only)
    vocab_size: int
    eos: Special
    pad: Special
    bos: Special | None = None
    # how messages and preference records become text (pinned; its digest keys the cache)
    chat_template: ChatTemplate = field(default=DEFAULT_CHAT_TEMPLATE)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype("<u2") if self.vocab_size <= 1 << 16 else np.dtype("<u4")

    @property
    def dtype_name(self) -> str:
        """How layer indexes spell the stored dtype (``uint16-le`` or ``uint32-le``)."""
        return f"uint{self.dtype.itemsize * 8}-le"

    def specials(self) -> dict[str, dict[str, Any]]:
        named = {"bos": self.bos, "eos": self.eos, "pad": self.pad}
        return {k: {"token": s.token, "id": s.id} for k, s in named.items() if s is not None}

    def document(self) -> dict[str, Any]:
        """The spec as the manifest and layer indexes record it (the file by ref, so ``verify``
        re-hashes it)."""
        out: dict[str, Any] = {
            "schema": SPEC_SCHEMA,
            "kind": self.kind,
            "digest": self.digest,
            "vocabSize": self.vocab_size,
            "dtype": self.dtype_name,
            "specialTokens": self.specials(),
        }
        if self.file is not None:
            out["file"] = self.file
        return out

    def token_key(self) -> dict[str, Any]:
        """What the cached token arrays depend on (PAD is not in them; the chat template is)."""
        bos = self.bos.id if self.bos else None
        return {
            "digest": self.digest,
            "eos": self.eos.id,
            "bos": bos,
            "dtype": self.dtype_name,
            "chatTemplate": self.chat_template.digest,
        }


def utf8_spec(bos: bool = False) -> TokenizerSpec:
    def special(name: str) -> Special:
        return Special(UTF8_SPECIALS[name], UTF8_IDS[name])

    return TokenizerSpec(
        kind=UTF8_BYTES,
        digest=UTF8_BYTES,
        file=None,
        vocab_size=UTF8_VOCAB,
        eos=special("eos"),
        pad=special("pad"),
        bos=special("bos") if bos else None,
    )


def resolve_tokenizer(ws: Workspace) -> TokenizerSpec:
    """The spec of ``policies.tokenizer``; a Hugging Face file is pinned into the CAS first."""
    policy = ws.config.policies.tokenizer
    if policy.kind == UTF8_BYTES:
        return utf8_spec(bos=policy.bos is not None)
    file = _pin_file(ws, policy)
    tokenizer = load_hf(ws.cas, file["digest"])
    vocab = tokenizer.get_vocab(with_added_tokens=True)

    def special(name: str) -> Special | None:
        token = getattr(policy, name)
        if token is None:
            return None
        if token not in vocab:
            raise TokenizerError(
                f"policies.tokenizer.{name}: token {token!r} is not in the vocabulary of "
                f"tokenizer {file['digest']} ({policy.path or 'from the CAS'})"
            )
        return Special(token, vocab[token])

    eos, pad = special("eos"), special("pad")
    assert eos is not None and pad is not None  # the config requires both for huggingface
    return TokenizerSpec(
        kind=HUGGINGFACE,
        digest=file["digest"],
        file=file,
        vocab_size=max(vocab.values(), default=-1) + 1,
        eos=eos,
        pad=pad,
        bos=special("bos"),
    )


def _pin_file(ws: Workspace, policy: TokenizerPolicy) -> Ref:
    """The tokenizer.json by path (pinned, checked against a declared digest) or by digest."""
    if policy.path is not None:
        path = ws.loaded.resolve(policy.path)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise TokenizerError(
                f"policies.tokenizer.path: cannot read {path}: {error.strerror}"
            ) from None
        digest = sha256_digest(data)
        if policy.digest is not None and policy.digest != digest:
            raise TokenizerError(
                f"policies.tokenizer: the file {path} has digest {digest}, but "
                f"policies.tokenizer.digest is {policy.digest}; fix the path or the digest"
            )
        if not ws.cas.contains(digest):
            ws.cas.put_bytes(data)
        return make_ref(digest, JSON, len(data))
    digest = policy.digest
    assert digest is not None  # the config requires a path or a digest
    if not ws.cas.contains(digest):
        raise TokenizerError(
            f"policies.tokenizer.digest: tokenizer {digest} is not in the CAS under {ws.cas.root}; "
            "give its path, or train one with `corpus-assets tokenizer train`"
        )
    return make_ref(digest, JSON, ws.cas.size(digest))


def load_hf(cas: ContentStore, digest: str) -> Tokenizer:
    """The tokenizer.json ``digest`` from the CAS (verified), parsed once per process."""
    key = (str(cas.root), digest)
    if key not in _LOADED:
        data = cas.get_bytes(digest, "tokenizer.json")
        try:
            _LOADED[key] = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as error:  # tokenizers raises a bare Exception on a malformed file
            raise TokenizerError(
                f"tokenizer {digest} is not a Hugging Face tokenizer.json: {error}"
            ) from None
    return _LOADED[key]

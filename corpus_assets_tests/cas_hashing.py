"""Which objects a piece of code re-hashes: ``ContentStore.verify`` wrapped to record them."""

import pytest

from corpus_assets.core.storage.cas import ContentStore


def hashed_digests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The digests every ``ContentStore.verify`` call hashes from now on, in order."""
    hashed: list[str] = []
    verify = ContentStore.verify

    def recorded(self: ContentStore, digest: str, *args: object, **kwargs: object) -> object:
        hashed.append(digest)
        return verify(self, digest, *args, **kwargs)

    monkeypatch.setattr(ContentStore, "verify", recorded)
    return hashed

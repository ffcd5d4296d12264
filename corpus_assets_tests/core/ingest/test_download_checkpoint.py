"""Background checkpoint commits: never a claim ahead of the disk, and failures are not lost."""

import hashlib
import json
import random
import time
from pathlib import Path

import pytest

from corpus_assets.core.ingest.download.checkpoint import PartialFile, locked_partial

URL = "http://example.invalid/object.zst"
BLOCKS = [random.Random(seed).randbytes(300_000) for seed in range(8)]


def claim(partial: PartialFile) -> dict:
    return json.loads(partial.checkpoint.read_bytes())


def assert_claim_matches_disk(partial: PartialFile) -> int:
    """The checkpoint's hash covers exactly the first bytes it claims, and the disk holds them."""
    checkpoint = claim(partial)
    on_disk = partial.path.read_bytes()
    verified = checkpoint["verified_bytes"]
    assert verified <= len(on_disk)
    assert checkpoint["sha256_prefix"] == hashlib.sha256(on_disk[:verified]).hexdigest()
    return verified


def wait_for_claim_past(partial: PartialFile, verified: int) -> int:
    deadline = time.monotonic() + 10
    while not partial.checkpoint.exists() or claim(partial)["verified_bytes"] <= verified:
        assert time.monotonic() < deadline, "the background checkpoint never landed"
        time.sleep(0.005)
    # The file lands just before the commit's future completes; until it does, save_if_due
    # starts no other commit, which the next step of a test may count on.
    while partial._committing is not None and not partial._committing.done():
        assert time.monotonic() < deadline, "the background commit never finished"
        time.sleep(0.005)
    return assert_claim_matches_disk(partial)


def test_a_background_checkpoint_claims_its_snapshot_and_save_covers_the_rest(
    tmp_path: Path,
) -> None:
    with locked_partial(
        URL, tmp_path, checkpoint_bytes=500_000, checkpoint_seconds=3600
    ) as partial:
        partial.append(BLOCKS[0])
        partial.save_if_due()  # the first checkpoint is due at once
        assert wait_for_claim_past(partial, 0) == 300_000
        partial.append(BLOCKS[1])
        partial.save_if_due()  # 300 kB since the last one: not due
        partial.append(BLOCKS[2])
        partial.save_if_due()  # 600 kB since: a commit of 900 kB starts in the background
        partial.append(BLOCKS[3])  # appended while that commit may still be syncing
        assert wait_for_claim_past(partial, 300_000) == 900_000  # the snapshot, no later byte
        partial.save()
        assert assert_claim_matches_disk(partial) == 1_200_000
    with locked_partial(URL, tmp_path, checkpoint_bytes=1, checkpoint_seconds=1) as again:
        assert again.adopt() is None  # a new process trusts the committed prefix
        assert again.state.verified == 1_200_000


def test_a_failed_background_commit_is_raised_and_written_again_later(tmp_path: Path) -> None:
    with locked_partial(URL, tmp_path, checkpoint_bytes=1, checkpoint_seconds=3600) as partial:
        partial.checkpoint.mkdir()
        (partial.checkpoint / "blocker").write_bytes(b"")  # os.replace onto it must fail
        partial.append(BLOCKS[0])
        partial.save_if_due()
        with pytest.raises(OSError):
            partial.save()  # waits for the commit in flight and re-raises its failure
        (partial.checkpoint / "blocker").unlink()
        partial.checkpoint.rmdir()
        partial.save()  # the failed claim was not counted as saved: it is written now
        assert assert_claim_matches_disk(partial) == len(BLOCKS[0])


def test_leaving_the_partial_waits_for_the_commit_in_flight(tmp_path: Path) -> None:
    with locked_partial(URL, tmp_path, checkpoint_bytes=1, checkpoint_seconds=3600) as partial:
        partial.append(BLOCKS[0])
        partial.save_if_due()
    assert claim(partial)["verified_bytes"] == len(BLOCKS[0])  # landed before the handle closed

"""Resumable, verified downloads of remote objects into the CAS: the family's front.

Other packages import from here only. :mod:`.transfer` makes the requests (ranges, retries,
resumes, the byte budget), :mod:`.checkpoint` keeps the verified prefix on disk and
:mod:`.decode` decodes a compressed object as it arrives, so a pin proves it decodes. What HTTP
says about an object (size, ETag, Last-Modified) is ``ingest.remote_http``, shared with listing.
"""

from corpus_assets.core.ingest.download.transfer import (
    TRANSFER_BUDGET,
    Fetched,
    InvalidObject,
    OverBudget,
    ResumeRefused,
    fetch_to_cas,
)

__all__ = [
    "TRANSFER_BUDGET",
    "Fetched",
    "InvalidObject",
    "OverBudget",
    "ResumeRefused",
    "fetch_to_cas",
]

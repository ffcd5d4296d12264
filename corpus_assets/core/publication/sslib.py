"""securesystemslib, imported in this one place: DSSE envelopes and Ed25519 keys.

Its signer package imports boto3 for an AWS KMS signer this project never uses (~0.15 CPU-s in
every process that signs or reads a manifest; secure-systems-lab/securesystemslib#1198), so
boto3 is hidden while it loads (``runtime.absent_imports``); the S3 store still imports boto3
when it is used.
"""

from corpus_assets.core.runtime.absent_imports import hidden_while

with hidden_while("boto3", "botocore"):
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import UnverifiedSignatureError, VerificationError
    from securesystemslib.signer import CryptoSigner, SSlibKey

__all__ = ["CryptoSigner", "Envelope", "SSlibKey", "UnverifiedSignatureError", "VerificationError"]

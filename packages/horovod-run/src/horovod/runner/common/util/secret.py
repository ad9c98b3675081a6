"""The per-job secret and HMAC-SHA256 digests made with it."""

import hashlib
import hmac

from horovod.common.rendezvous import SECRET_ENV, SECRET_LENGTH, make_secret_key

DIGEST_LENGTH = 32
# Environment variable through which a worker receives the job secret (hex); never exported on a
# command line (see env.IGNORE_REGEXES).
HOROVOD_SECRET_KEY = SECRET_ENV

__all__ = ["make_secret_key", "compute_digest", "check_digest", "SECRET_LENGTH", "DIGEST_LENGTH",
           "HOROVOD_SECRET_KEY"]


def compute_digest(key: bytes, message: bytes) -> bytes:
    """Return the 32-byte HMAC-SHA256 of ``message`` under ``key``."""
    return hmac.new(key, message, hashlib.sha256).digest()


def check_digest(key: bytes, message: bytes, digest: bytes) -> bool:
    """True if ``digest`` is the HMAC-SHA256 of ``message`` under ``key`` (constant time)."""
    return hmac.compare_digest(compute_digest(key, message), digest)

"""The accepted API keys: resolved once where the app is built, kept as SHA-256 digests, checked in constant time.

Keys come from `service.api_keys` (plain, or `sha256:<64 hex digits>` so the config file holds no secret) and
from `$APP_API_KEYS` (comma-separated, either form) in the process that builds the app: the CLI for
`python -m app serve` (also with `RAY_ADDRESS`), Serve's build task for `serve deploy` and KubeRay (which
sees the head pod's environment, e.g. a Secret). `resolve` turns them into digests written into the config
that every replica is deployed with, so a replica never depends on its own environment and never holds a
plain key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

API_KEYS_ENV = "APP_API_KEYS"
DIGEST_PREFIX = "sha256:"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def is_digest(entry: str) -> bool:
    return bool(_DIGEST.match(entry))


def digest_of(key: str) -> str:
    """A key's config form that holds no secret: `sha256:<hex>`."""
    return DIGEST_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def as_digest(entry: str) -> str:
    """A config entry (plain or `sha256:<hex>`) in its digest form."""
    return entry if is_digest(entry) else digest_of(entry)


def raw_digest(entry: str) -> bytes:
    """A config entry's SHA-256 digest as bytes, what a presented key is compared with."""
    return bytes.fromhex(as_digest(entry)[len(DIGEST_PREFIX):])


def check_entry(entry: str) -> str:
    """`entry` if it is a plain key or a well-formed digest; ValueError (a config validator's) if it only starts
    like one."""
    if entry.startswith(DIGEST_PREFIX) and not is_digest(entry):
        raise ValueError(
            f"'{entry[:16]}...' starts like a digest but is not `sha256:` and 64 lower-case hex "
            "digits (python -c \"import hashlib;print(hashlib.sha256(b'KEY').hexdigest())\")"
        )
    return entry


def from_environment() -> tuple[str, ...]:
    return tuple(k.strip() for k in os.environ.get(API_KEYS_ENV, "").split(",") if k.strip())


@dataclass(frozen=True)
class ApiKeys:
    digests: frozenset[bytes]  # raw SHA-256 digests of the accepted keys

    @classmethod
    def of(cls, entries: Iterable[str]) -> ApiKeys:
        """Entries in either form (plain or `sha256:<hex>`)."""
        return cls(frozenset(raw_digest(e) for e in entries))

    def __bool__(self) -> bool:
        return bool(self.digests)

    def accept(self, authorization: bytes) -> bool:
        return self.match(authorization) is not None

    def match(self, authorization: bytes) -> bytes | None:
        """The digest of the accepted bearer key an `Authorization` header carries (None: none). Compared against
        every digest, so the time taken says nothing about which one matched or how close a guess was."""
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return None
        presented = hashlib.sha256(token.strip()).digest()
        matched = False
        for digest in self.digests:
            matched |= hmac.compare_digest(presented, digest)
        return presented if matched else None


def resolve(entries: Iterable[str]) -> tuple[str, ...]:
    """Config entries plus the environment's, all as digests, sorted (a stable config for Serve to compare)."""
    return tuple(sorted({as_digest(e) for e in (*entries, *from_environment())}))

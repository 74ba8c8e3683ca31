"""The primary-key fingerprints of an OpenPGP public key file (armored or binary), standard library only.

Used to pin an apt repository's signing key: the file a vendor publishes is accepted only when every primary
key in it has one of the fingerprints the kit pins (RFC 4880 v4: SHA-1 over 0x99, a two-octet length and the
key packet; RFC 9580 v6: SHA-256 over 0x9B, a four-octet length and the packet; v5 drafts: SHA-256 over 0x9A).

    primary_fingerprints(open("docker.gpg", "rb").read())   # ["9DC858229FC7DD38854AE2D88D81803C0EBFCD88"]
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

__all__ = ["KeyFileError", "normalise_fingerprint", "primary_fingerprints"]

_PUBLIC_KEY = 6
_ARMOR_BEGIN = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"


class KeyFileError(Exception):
    """Not an OpenPGP public key file the kit can read."""


def normalise_fingerprint(text: str) -> str:
    """Upper-case hex without spaces (``9DC8 5822 ...`` and ``9dc85822...`` compare equal)."""
    return re.sub(r"\s+", "", text).upper()


def _dearmor(data: bytes) -> bytes:
    if _ARMOR_BEGIN not in data:
        return data
    lines = data[data.index(_ARMOR_BEGIN) :].splitlines()[1:]
    body: list[bytes] = []
    in_headers = True
    for raw in lines:
        line = raw.strip()
        if line.startswith(b"-----END"):
            break
        if in_headers:
            if not line:
                in_headers = False
            elif b":" not in line:  # no armor headers at all: this is already data
                in_headers = False
                body.append(line)
            continue
        if line.startswith(b"=") and len(line) == 5:
            break  # the CRC-24 line
        body.append(line)
    try:
        return base64.b64decode(b"".join(body), validate=True)
    except binascii.Error as exc:
        raise KeyFileError(f"broken ASCII armor: {exc}") from None


def _packets(data: bytes) -> list[tuple[int, bytes]]:
    packets: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(data):
        first = data[pos]
        pos += 1
        if not first & 0x80:
            raise KeyFileError(f"not an OpenPGP packet at byte {pos - 1}")
        if first & 0x40:  # new format
            tag = first & 0x3F
            if pos >= len(data):
                raise KeyFileError("truncated packet header")
            o1 = data[pos]
            if o1 < 192:
                length, pos = o1, pos + 1
            elif o1 < 224:
                length, pos = ((o1 - 192) << 8) + data[pos + 1] + 192, pos + 2
            elif o1 == 255:
                length, pos = int.from_bytes(data[pos + 1 : pos + 5], "big"), pos + 5
            else:
                raise KeyFileError("partial-length packets do not occur in key files")
        else:  # old format
            tag = (first >> 2) & 0x0F
            kind = first & 0x03
            if kind == 3:
                length = len(data) - pos
            else:
                width = (1, 2, 4)[kind]
                length, pos = int.from_bytes(data[pos : pos + width], "big"), pos + width
        if pos + length > len(data):
            raise KeyFileError("truncated packet")
        packets.append((tag, data[pos : pos + length]))
        pos += length
    return packets


def _fingerprint(body: bytes) -> str:
    if not body:
        raise KeyFileError("empty public-key packet")
    version = body[0]
    if version == 4:
        return hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()  # noqa: S324
    if version in (5, 6):
        prefix = b"\x9a" if version == 5 else b"\x9b"
        return hashlib.sha256(prefix + len(body).to_bytes(4, "big") + body).hexdigest().upper()
    raise KeyFileError(f"public-key packet version {version} is not supported (v4, v5, v6 are)")


def primary_fingerprints(data: bytes) -> list[str]:
    """Fingerprints of every primary public key in ``data`` (subkeys are bound to them, not listed)."""
    if len(data) > 1024 * 1024:
        raise KeyFileError(f"{len(data)} bytes: far too big for a repository signing key")
    found = [_fingerprint(body) for tag, body in _packets(_dearmor(data)) if tag == _PUBLIC_KEY]
    if not found:
        raise KeyFileError("no OpenPGP public key in it (an HTML page or a different file?)")
    return found

"""One OpenPGP public key from a key file (armored or binary), checked packet by packet, standard library only.

Used to pin an apt repository's signing key. apt trusts every key a keyring file holds (every armor block of an
``.asc``, every primary key of a binary one), so the kit never installs the file it downloaded: it parses it
into OpenPGP packets (RFC 4880 / RFC 9580 framing), accepts exactly one transferable public key (one primary key
packet, first, then only the user IDs, user attributes, subkeys and signatures that belong to a key) and
nothing after it (no second armor block, no second primary key, no trailing bytes), and writes back only those
packets, re-encoded (new-format headers) and re-armored with a fresh CRC-24. The primary key's fingerprint is
RFC 4880 v4's SHA-1 over 0x99, a two-octet length and the key packet, RFC 9580 v6's SHA-256 over 0x9B and a
four-octet length (v5 drafts: 0x9A).

    key = read_public_key(open("docker.gpg", "rb").read())   # KeyFileError for anything else
    key.fingerprint                                          # "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
    key.armored()                                            # the bytes to install
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

__all__ = [
    "KeyFileError",
    "Packet",
    "PublicKey",
    "armor",
    "normalise_fingerprint",
    "read_public_key",
]

MAX_KEY_FILE = 1024 * 1024
_PUBLIC_KEY, _SIGNATURE, _USER_ID, _PUBLIC_SUBKEY, _USER_ATTRIBUTE = 6, 2, 13, 14, 17
# What a transferable public key is made of (RFC 4880 11.1, RFC 9580 10.1); anything else is refused.
_KEY_PACKETS = {_PUBLIC_KEY, _SIGNATURE, _USER_ID, _PUBLIC_SUBKEY, _USER_ATTRIBUTE}
_ARMOR_BEGIN = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"
_ARMOR_END = b"-----END PGP PUBLIC KEY BLOCK-----"
_ARMOR_ANY = re.compile(rb"-----(BEGIN|END) PGP [A-Z ,/0-9]*-----")
_BASE64_LINE = re.compile(rb"[A-Za-z0-9+/]+={0,2}")


class KeyFileError(Exception):
    """Not exactly one OpenPGP public key the kit can read and re-write."""


@dataclass(frozen=True)
class Packet:
    tag: int
    body: bytes

    def encoded(self) -> bytes:
        """The packet with a new-format header (RFC 4880 4.2.2: one-, two- or five-octet length)."""
        size = len(self.body)
        if size < 192:
            length = bytes([size])
        elif size < 8384:
            length = bytes([((size - 192) >> 8) + 192, (size - 192) & 0xFF])
        else:
            length = b"\xff" + size.to_bytes(4, "big")
        return bytes([0xC0 | self.tag]) + length + self.body


@dataclass(frozen=True)
class PublicKey:
    fingerprint: str
    packets: tuple[Packet, ...]

    def binary(self) -> bytes:
        return b"".join(packet.encoded() for packet in self.packets)

    def armored(self) -> bytes:
        return armor(self.binary())


def normalise_fingerprint(text: str) -> str:
    """Upper-case hex without spaces (``9DC8 5822 ...`` and ``9dc85822...`` compare equal)."""
    return re.sub(r"\s+", "", text).upper()


def _crc24(data: bytes) -> int:
    crc = 0xB704CE
    for octet in data:
        crc ^= octet << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def armor(data: bytes) -> bytes:
    """``data`` as one ASCII-armored public key block (RFC 4880 6.2), 64 columns, with its CRC-24."""
    text = base64.b64encode(data)
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    crc = base64.b64encode(_crc24(data).to_bytes(3, "big"))
    return b"\n".join([_ARMOR_BEGIN, b"", *lines, b"=" + crc, _ARMOR_END]) + b"\n"


def _dearmor(data: bytes) -> bytes:
    """The one armor block's data; a KeyFileError for anything around it or a second block."""
    start = data.index(_ARMOR_BEGIN)
    if data[:start].strip():
        raise KeyFileError(f"{start} bytes of something else before the armor block: not a plain key file")
    end = data.find(_ARMOR_END, start)
    if end < 0:
        raise KeyFileError("the armor block has no END line (a truncated download?)")
    after = data[end + len(_ARMOR_END) :]
    if after.strip():
        more = "a second armor block" if _ARMOR_ANY.search(after) else f"{len(after.strip())} more bytes"
        raise KeyFileError(
            f"{more} after the first armor block: apt would trust every key in the file, and only the first was "
            "checked (vendors publish one key per file)"
        )
    rest_of_begin, *lines = data[start + len(_ARMOR_BEGIN) : end].splitlines() or [b""]
    if rest_of_begin.strip():
        raise KeyFileError("text after the armor's BEGIN line on the same line: not a plain key file")
    body: list[bytes] = []
    checksum: bytes | None = None
    in_headers = True
    for raw in lines:
        line = raw.strip()
        if _ARMOR_ANY.search(line):
            raise KeyFileError("an armor line inside the armor block: not a single key block")
        if in_headers:
            if not line:
                if body or checksum is not None:
                    raise KeyFileError("a blank line inside the armor block's data")
                in_headers = False
                continue
            if b": " in line:  # an armor header (Version:, Comment:): says nothing about the key
                continue
            in_headers = False  # no armor headers and no blank line: this is already data
        if not line:
            continue
        if checksum is not None:
            raise KeyFileError("data after the armor checksum line")
        if line.startswith(b"=") and len(line) == 5:
            checksum = line[1:]
            continue
        if not _BASE64_LINE.fullmatch(line):
            raise KeyFileError(f"broken ASCII armor: {line[:40]!r} is not base64")
        body.append(line)
    try:
        decoded = base64.b64decode(b"".join(body), validate=True)
        expected = base64.b64decode(checksum, validate=True) if checksum is not None else None
    except binascii.Error as exc:
        raise KeyFileError(f"broken ASCII armor: {exc}") from None
    if expected is not None and int.from_bytes(expected, "big") != _crc24(decoded):
        raise KeyFileError("the armor's CRC-24 does not match its data (a corrupted or altered file)")
    return decoded


def _packets(data: bytes) -> list[Packet]:
    """Every packet, framed strictly: definite lengths only, and every byte inside a packet."""
    packets: list[Packet] = []
    pos = 0
    while pos < len(data):
        first = data[pos]
        pos += 1
        if not first & 0x80:
            raise KeyFileError(f"not an OpenPGP packet at byte {pos - 1} (trailing data after the key?)")
        if first & 0x40:  # new format
            tag = first & 0x3F
            if pos >= len(data):
                raise KeyFileError("truncated packet header")
            o1 = data[pos]
            if o1 < 192:
                length, pos = o1, pos + 1
            elif o1 < 224:
                if pos + 1 >= len(data):
                    raise KeyFileError("truncated packet header")
                length, pos = ((o1 - 192) << 8) + data[pos + 1] + 192, pos + 2
            elif o1 == 255:
                if pos + 5 > len(data):
                    raise KeyFileError("truncated packet header")
                length, pos = int.from_bytes(data[pos + 1 : pos + 5], "big"), pos + 5
            else:
                raise KeyFileError("partial-length packets do not occur in key files")
        else:  # old format
            tag = (first >> 2) & 0x0F
            kind = first & 0x03
            if kind == 3:
                raise KeyFileError("an indeterminate-length packet does not occur in key files")
            width = (1, 2, 4)[kind]
            if pos + width > len(data):
                raise KeyFileError("truncated packet header")
            length, pos = int.from_bytes(data[pos : pos + width], "big"), pos + width
        if pos + length > len(data):
            raise KeyFileError("truncated packet")
        packets.append(Packet(tag, data[pos : pos + length]))
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


def read_public_key(data: bytes) -> PublicKey:
    """The one public key in ``data`` (armored or binary) and its packets; a KeyFileError for anything else:
    no key, a second primary key, a second armor block, bytes around the key, a packet no key is made of."""
    if len(data) > MAX_KEY_FILE:
        raise KeyFileError(f"{len(data)} bytes: far too big for a repository signing key")
    packets = _packets(_dearmor(data) if _ARMOR_BEGIN in data else data)
    primaries = [i for i, packet in enumerate(packets) if packet.tag == _PUBLIC_KEY]
    if not primaries:
        raise KeyFileError("no OpenPGP public key in it (an HTML page or a different file?)")
    if primaries[0] != 0:
        raise KeyFileError(f"the file starts with a packet of type {packets[0].tag}, not with the public key")
    if len(primaries) > 1:
        others = ", ".join(_fingerprint(packets[i].body) for i in primaries[1:])
        raise KeyFileError(
            f"{len(primaries)} primary keys in one file (after {_fingerprint(packets[0].body)}: {others}): apt "
            "would trust each of them, and one key per file is all a vendor publishes"
        )
    strangers = sorted({packet.tag for packet in packets} - _KEY_PACKETS)
    if strangers:
        raise KeyFileError(f"packets of type {', '.join(map(str, strangers))}, which a public key is not made of")
    return PublicKey(_fingerprint(packets[0].body), tuple(packets))

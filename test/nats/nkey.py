#!/usr/bin/env python3
"""A new NATS user NKey for the tests: prints its seed (SU...) and its
public key (U...), separated by a space.  NKeys: base32 (RFC 4648, no
padding) of a prefix, the raw ed25519 key and a CRC-16/XMODEM of both,
little-endian."""
import base64

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat


def crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def encode(raw):
    crc = crc16(raw)
    return base64.b32encode(raw + bytes([crc & 0xFF, crc >> 8])).decode().rstrip('=')


USER = 20 << 3
SEED = 18 << 3
key = Ed25519PrivateKey.generate()
private = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
seed = encode(bytes([SEED | (USER >> 5), (USER & 31) << 3]) + private)
print(seed, encode(bytes([USER]) + public))

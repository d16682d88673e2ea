#!/usr/bin/python3
"""ed25519_helper: Standard Webhooks v1a signatures checked with Python's
`cryptography` (Debian's python3-cryptography), independently of the
extension's C.  Used as a co-process by test/verify/receiver.js and run
directly by test/t/034_signatures.pl.

Reads JSON requests, one a line, on standard input and answers each with
one JSON line on standard output, in order:

    {"op": "verify", "tag": T, "public_key": "whpk_...", "msg_b64": "...",
     "sig_b64": "..."}
        -> {"tag": T, "ok": true|false, "error": "..."}
           ok: the 64-byte signature (base64, as after "v1a,") is the
           ed25519 signature of the message by that public key
    {"op": "public", "tag": T, "secret": "whsk_..."}
        -> {"tag": T, "public_key": "whpk_..."}   (of the 32-byte seed; a
           64-byte key must end with the seed's public key)
    {"op": "sign", "tag": T, "secret": "whsk_...", "msg_b64": "..."}
        -> {"tag": T, "sig_b64": "..."}   (ed25519 is deterministic: the
           same key and message give the same signature)

A request that cannot be done answers {"tag": T, "error": "..."}.
"""

import base64
import binascii
import json
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

RAW = serialization.Encoding.Raw


def b64(data):
    return base64.b64encode(data).decode("ascii")


def unb64(text, what):
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError) as e:
        raise ValueError(f"{what} is not base64: {e}") from None


def private_key(secret):
    if not isinstance(secret, str) or not secret.startswith("whsk_"):
        raise ValueError("not a whsk_ key")
    raw = unb64(secret[5:], "whsk_ key")
    if len(raw) not in (32, 64):
        raise ValueError(f"a whsk_ key has 32 or 64 bytes, not {len(raw)}")
    key = Ed25519PrivateKey.from_private_bytes(raw[:32])
    if len(raw) == 64:
        pub = key.public_key().public_bytes(RAW, serialization.PublicFormat.Raw)
        if pub != raw[32:]:
            raise ValueError("the last 32 bytes of the whsk_ key are not its public key")
    return key


def public_key(text):
    if not isinstance(text, str) or not text.startswith("whpk_"):
        raise ValueError("not a whpk_ key")
    raw = unb64(text[5:], "whpk_ key")
    if len(raw) != 32:
        raise ValueError(f"a whpk_ key has 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def handle(req):
    op = req.get("op")
    if op == "verify":
        pub = public_key(req["public_key"])
        msg = unb64(req["msg_b64"], "message")
        sig = unb64(req["sig_b64"], "signature")
        if len(sig) != 64:
            return {"ok": False, "error": f"the signature has {len(sig)} bytes, not 64"}
        try:
            pub.verify(sig, msg)
        except InvalidSignature:
            return {"ok": False, "error": "invalid signature"}
        return {"ok": True}
    if op == "public":
        pub = private_key(req["secret"]).public_key()
        return {"public_key": "whpk_" + b64(pub.public_bytes(RAW, serialization.PublicFormat.Raw))}
    if op == "sign":
        key = private_key(req["secret"])
        return {"sig_b64": b64(key.sign(unb64(req["msg_b64"], "message")))}
    raise ValueError(f"unknown op {op!r}")


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        tag = None
        try:
            req = json.loads(line)
            tag = req.get("tag")
            ans = handle(req)
        except Exception as e:  # answer every line, whatever went wrong
            ans = {"error": f"{type(e).__name__}: {e}"}
        ans["tag"] = tag
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

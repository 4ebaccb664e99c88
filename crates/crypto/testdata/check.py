#!/usr/bin/env python3
"""Independent cross-check of the vectors in this directory (Python hmac + pyca/cryptography).

Run: python3 crates/crypto/testdata/check.py   (needs `cryptography`, e.g. Debian python3-cryptography)
The Rust tests load the same files with include_str!; this script guards against transcription
errors by recomputing every expected value with a second implementation.
"""
import hashlib
import hmac
import os
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

HERE = os.path.dirname(os.path.abspath(__file__))
HASH = {"HmacSha1": hashlib.sha1, "HmacSha256": hashlib.sha256,
        "HmacSha384": hashlib.sha384, "HmacSha512": hashlib.sha512,
        "HmacSha1_96": hashlib.sha1, "HmacSha256_128": hashlib.sha256,
        "HmacSha384_192": hashlib.sha384, "HmacSha512_256": hashlib.sha512}


def blocks(name):
    cur, out = None, []
    for line in open(os.path.join(HERE, name)):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            cur = {"name": line[1:-1]}
            out.append(cur)
            continue
        k, v = (s.strip() for s in line.split("=", 1))
        cur[k] = v
    return out


def h(b, k):
    return bytes.fromhex(b[k])


def prf_plus(hf, key, seed, n):
    out, t, i = b"", b"", 1
    while len(out) < n:
        t = hmac.new(key, t + seed + bytes([i]), hf).digest()
        out += t
        i += 1
    return out[:n]


fails = 0
def check(name, ok):
    global fails
    if not ok:
        fails += 1
        print("MISMATCH", name)

for b in blocks("prf.txt"):
    check(b["name"], hmac.new(h(b, "key"), h(b, "data"), HASH[b["prf"]]).digest() == h(b, "out"))
for b in blocks("integ.txt"):
    icv = h(b, "icv")
    check(b["name"], hmac.new(h(b, "key"), h(b, "data"), HASH[b["integ"]]).digest()[:len(icv)] == icv)
for b in blocks("prf_plus.txt"):
    out = h(b, "out")
    check(b["name"], prf_plus(HASH[b["prf"]], h(b, "key"), h(b, "seed"), len(out)) == out)
for b in blocks("aead.txt"):
    key, iv = h(b, "key"), h(b, "iv")
    nonce = key[-4:] + iv
    alg = ChaCha20Poly1305(key[:-4]) if b["encr"] == "ChaCha20Poly1305" else AESGCM(key[:-4])
    sealed = alg.encrypt(nonce, h(b, "plain"), h(b, "aad"))
    check(b["name"], sealed == h(b, "cipher") + h(b, "icv"))
for b in blocks("cbc.txt"):
    enc = Cipher(algorithms.AES(h(b, "key")), modes.CBC(h(b, "iv"))).encryptor()
    check(b["name"], enc.update(h(b, "plain")) + enc.finalize() == h(b, "cipher"))

MODP2048_P = int(
    "ffffffffffffffffc90fdaa22168c234c4c6628b80dc1cd129024e088a67cc74020bbea63b139b22514a08798e3404dd"
    "ef9519b3cd3a431b302b0a6df25f14374fe1356d6d51c245e485b576625e7ec6f44c42e9a637ed6b0bff5cb6f406b7ed"
    "ee386bfb5a899fa5ae9f24117c4b1fe649286651ece45b3dc2007cb8a163bf0598da48361c55d39a69163fa8fd24cf5f"
    "83655d23dca3ad961c62f356208552bb9ed529077096966d670c354e4abc9804f1746c08ca18217c32905e462e36ce3b"
    "e39e772c180e86039b2783a2ec07a28fb5c55df06f4c52c9de2bcbf6955817183995497cea956ae515d2261898fa0510"
    "15728e5a8aacaa68ffffffffffffffff", 16)
from cryptography.hazmat.primitives.asymmetric import ec, x25519
from cryptography.hazmat.primitives import serialization
RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw
X962 = serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
for b in blocks("ke.txt"):
    g, i, gr, gir = b["group"], h(b, "i"), h(b, "gr"), h(b, "gir")
    if g == "Curve25519":
        k = x25519.X25519PrivateKey.from_private_bytes(i)
        gi = k.public_key().public_bytes(*RAW)
        s = k.exchange(x25519.X25519PublicKey.from_public_bytes(gr))
    elif g in ("Ecp256", "Ecp384"):
        curve = ec.SECP256R1() if g == "Ecp256" else ec.SECP384R1()
        k = ec.derive_private_key(int.from_bytes(i, "big"), curve)
        gi = k.public_key().public_bytes(*X962)[1:]
        peer = ec.EllipticCurvePublicKey.from_encoded_point(curve, b"\x04" + gr)
        s = k.exchange(ec.ECDH(), peer)
    else:
        x = int.from_bytes(i, "big")
        gi = pow(2, x, MODP2048_P).to_bytes(256, "big")
        s = pow(int.from_bytes(gr, "big"), x, MODP2048_P).to_bytes(256, "big")
    check(b["name"], s == gir and ("gi" not in b or gi == h(b, "gi")))

print("all vectors agree" if not fails else f"{fails} mismatches")
sys.exit(1 if fails else 0)

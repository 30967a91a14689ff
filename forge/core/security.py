"""Password hashing, token material and encryption of secrets at rest."""

import asyncio
import base64
import hashlib
import secrets
import string

from argon2 import Parameters, PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

TOKEN_PREFIX = "fh_"
_TOKEN_ALPHABET = string.ascii_letters + string.digits
_TOKEN_BODY_LEN = 40  # ~238 bits of entropy
_hasher = PasswordHasher()
# Verified when the login is unknown, so that the response time does not reveal which logins exist.
# Made on first use, not at import: every CLI command imports this module.
_dummy_hash: list[str] = []


def use_password_parameters(parameters: Parameters) -> None:
    """Hash new passwords with `parameters` (argon2-cffi's default, RFC 9106's low-memory profile,
    unless called). A stored hash always verifies with the parameters it names, so changing them
    never locks anyone out. The test suite calls it with `argon2.profiles.CHEAPEST`: a hash there
    costs microseconds where the default takes 0.1 to 0.5 s and 64 MiB."""
    global _hasher
    _hasher = PasswordHasher.from_parameters(parameters)
    _dummy_hash.clear()


def _hash_password_sync(password: str) -> str:
    return _hasher.hash(password)


def _verify_password_sync(password_hash: str | None, password: str) -> bool:
    if not _dummy_hash:
        _dummy_hash.append(_hasher.hash(secrets.token_urlsafe(16)))
    try:
        return _hasher.verify(password_hash or _dummy_hash[0], password) and password_hash is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


async def hash_password(password: str) -> str:
    # argon2 is deliberately slow: never on the event loop.
    return await asyncio.to_thread(_hash_password_sync, password)


async def verify_password(password_hash: str | None, password: str) -> bool:
    return await asyncio.to_thread(_verify_password_sync, password_hash, password)


def generate_password() -> str:
    return secrets.token_urlsafe(18)


def generate_token() -> str:
    return TOKEN_PREFIX + "".join(secrets.choice(_TOKEN_ALPHABET) for _ in range(_TOKEN_BODY_LEN))


def looks_like_token(value: str) -> bool:
    body = value[len(TOKEN_PREFIX) :]
    return value.startswith(TOKEN_PREFIX) and len(body) == _TOKEN_BODY_LEN and all(c in _TOKEN_ALPHABET for c in body)


def sha256_hex(value: str) -> str:
    # Tokens and session ids are long random strings: a fast hash is the right tool (no brute force).
    return hashlib.sha256(value.encode()).hexdigest()


def random_id(nbytes: int = 32) -> str:
    return secrets.token_urlsafe(nbytes)


class SecretBox:
    """Symmetric encryption for secrets stored in the database (webhook secrets, model keys).

    The key is derived from the instance secret key with HKDF, one key per purpose."""

    def __init__(self, secret_key: str, purpose: str = "forgehand-secrets-v1") -> None:
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose.encode()).derive(secret_key.encode())
        self._fernet = Fernet(base64.urlsafe_b64encode(key))

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, ciphertext: str) -> str:
        try:
            return self._fernet.decrypt(ciphertext.encode()).decode()
        except InvalidToken:
            raise ValueError("stored secret cannot be decrypted with this instance's secret key") from None

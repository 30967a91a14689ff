"""Token material, password hashing and the at-rest secret box."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge.core.security import (
    SecretBox,
    generate_token,
    hash_password,
    looks_like_token,
    sha256_hex,
    verify_password,
)


def test_tokens_are_prefixed_random_and_recognised() -> None:
    a, b = generate_token(), generate_token()
    assert a != b and a.startswith("fh_") and len(a) == 43
    assert looks_like_token(a)
    assert sha256_hex(a) != sha256_hex(b)


@given(st.text(max_size=60))
def test_looks_like_token_rejects_arbitrary_text(value: str) -> None:
    if looks_like_token(value):
        assert value.startswith("fh_") and len(value) == 43 and value[3:].isalnum()


async def test_password_hash_roundtrip() -> None:
    h = await hash_password("correct horse battery")
    assert h.startswith("$argon2")
    assert await verify_password(h, "correct horse battery")
    assert not await verify_password(h, "wrong")
    assert not await verify_password(None, "anything")
    assert not await verify_password("not-a-hash", "anything")


async def test_the_default_parameters_and_hashes_made_with_others_still_verify() -> None:
    import argon2
    import argon2.profiles

    from forge.core import security

    cheap = await hash_password("correct horse battery")  # the suite hashes with the cheapest profile
    security.use_password_parameters(argon2.profiles.RFC_9106_LOW_MEMORY)  # argon2-cffi's default
    try:
        strong = await hash_password("correct horse battery")
        params = argon2.extract_parameters(strong)
        assert (params.type, params.time_cost, params.memory_cost, params.parallelism) == (argon2.Type.ID, 3, 65536, 4)
        assert await verify_password(cheap, "correct horse battery")
        assert await verify_password(strong, "correct horse battery")
        assert not await verify_password(strong, "wrong")
    finally:
        security.use_password_parameters(argon2.profiles.CHEAPEST)


def test_secret_box_roundtrip_and_key_separation() -> None:
    box = SecretBox("k" * 40)
    sealed = box.encrypt("whsec_abc")
    assert "whsec_abc" not in sealed
    assert box.decrypt(sealed) == "whsec_abc"
    with pytest.raises(ValueError, match="cannot be decrypted"):
        SecretBox("z" * 40).decrypt(sealed)
    with pytest.raises(ValueError, match="cannot be decrypted"):
        SecretBox("k" * 40, purpose="other").decrypt(sealed)

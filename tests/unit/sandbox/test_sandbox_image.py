"""The image recipes: deploy/ copies match the package's, and the version is carried everywhere."""

from pathlib import Path

from sandbox.images.sandbox_image import (
    DEFAULT_IMAGE,
    DOCKERFILE,
    IMAGE_VERSION,
    OFFLINE_DOCKERFILE,
    PACKAGES,
    VERSION_LABEL,
)

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "sandbox"


def test_deploy_recipes_match_the_package() -> None:
    assert (DEPLOY / "Dockerfile").read_text() == DOCKERFILE
    assert (DEPLOY / "Dockerfile.offline").read_text() == OFFLINE_DOCKERFILE


def test_offline_script_matches_version_and_packages() -> None:
    script = (DEPLOY / "build-offline.sh").read_text()
    assert f"VERSION={IMAGE_VERSION}\n" in script
    assert "--include=" + ",".join(PACKAGES) in script
    assert "--variant=minbase" in script


def test_recipes_carry_user_workspace_and_label() -> None:
    assert f"forgehand-sandbox:{IMAGE_VERSION}" == DEFAULT_IMAGE
    for recipe in (DOCKERFILE, OFFLINE_DOCKERFILE):
        assert "--uid 1000 --gid 1000 --home-dir /home/agent" in recipe
        assert "chown 1000:1000 /workspace" in recipe
        assert f"LABEL {VERSION_LABEL}=$FORGEHAND_SANDBOX_VERSION" in recipe
        assert f"ARG FORGEHAND_SANDBOX_VERSION={IMAGE_VERSION}" in recipe
        assert "USER 1000:1000" in recipe
        assert "chmod ug-s" in recipe  # no setuid/setgid binaries left in the image
    assert "FROM debian:bookworm-slim" in DOCKERFILE
    assert all(pkg in DOCKERFILE for pkg in PACKAGES)

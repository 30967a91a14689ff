"""Which file declares a repository's environment, read by its name."""

from collections.abc import Collection

from sandbox.environment.devcontainer import parse_devcontainer
from sandbox.environment.spec import (
    DEVCONTAINER_FILES,
    ENVIRONMENT_FILES,
    ENVIRONMENT_YML,
    EnvironmentSpec,
    parse_environment_yml,
)
from sandbox.errors import EnvironmentRefused


def parse_environment(path: str, data: bytes | str, *, allowed_images: Collection[str]) -> EnvironmentSpec:
    """The declaration in the file `path` (one of ENVIRONMENT_FILES), or EnvironmentRefused (also
    for input nested past what the parsers' recursion can take)."""
    try:
        if path == ENVIRONMENT_YML:
            return parse_environment_yml(data, allowed_images=allowed_images)
        if path in DEVCONTAINER_FILES:
            return parse_devcontainer(data, allowed_images=allowed_images, source=path)
    except RecursionError:
        raise EnvironmentRefused(["nested too deep to read"]) from None
    raise EnvironmentRefused([f"{path!r} is not an environment file (one of {', '.join(ENVIRONMENT_FILES)})"])

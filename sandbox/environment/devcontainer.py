"""The subset of a devcontainer.json an environment takes (docs/environments.md): `image`,
`onCreateCommand` and `postCreateCommand` as the setup, `containerEnv` as `env`, and
`customizations.forgehand` for what a devcontainer has no word for; every other key is refused
with its reason. JSON with comments and trailing commas, as devcontainers allow."""

import json
import re
import shlex
from collections.abc import Collection
from typing import Any

from sandbox.environment.spec import DEVCONTAINER_FILES, EnvironmentSpec, checked_spec, one_line, read_text
from sandbox.errors import EnvironmentRefused

# Devcontainer keys that change nothing a sandbox does (a title, editor settings, a schema).
_DEVCONTAINER_IGNORED = frozenset({"name", "customizations", "$schema"})


_DEVCONTAINER_USED = frozenset({"image", "onCreateCommand", "postCreateCommand", "containerEnv"})


_BUILD = "images are never built from a repository's Dockerfile: name an allowed image"


_HARDENING = "a sandbox's hardening is never loosened by a repository"


_PORTS = "sandboxes publish no ports"


_USER = "the sandbox always runs as uid 1000"


_LIFECYCLE = "only onCreateCommand and postCreateCommand run, once, when the environment is built"


# Why each devcontainer key forgehand knows of is refused; any other key is refused as unsupported.
_DEVCONTAINER_REFUSED = {
    "initializeCommand": "it runs on the host in the devcontainer spec; nothing of a repository runs on the host",
    "mounts": "host paths are never mounted into a sandbox",
    "workspaceMount": "host paths are never mounted into a sandbox",
    "workspaceFolder": "the workspace is always /workspace",
    "features": "features are fetched from registries and install as root: install into /opt/env in a command",
    "build": _BUILD,
    "dockerFile": _BUILD,
    "dockerfile": _BUILD,
    "context": _BUILD,
    "dockerComposeFile": "Docker Compose is not supported: a sandbox is one container",
    "service": "Docker Compose is not supported: a sandbox is one container",
    "runServices": "Docker Compose is not supported: a sandbox is one container",
    "runArgs": "a sandbox's Docker arguments are forgehand's own",
    "privileged": _HARDENING,
    "capAdd": _HARDENING,
    "securityOpt": _HARDENING,
    "init": "every sandbox already runs an init",
    "forwardPorts": _PORTS,
    "appPort": _PORTS,
    "portsAttributes": _PORTS,
    "otherPortsAttributes": _PORTS,
    "remoteUser": _USER,
    "containerUser": _USER,
    "updateRemoteUserUID": _USER,
    "userEnvProbe": _USER,
    "remoteEnv": "use containerEnv",
    "postStartCommand": _LIFECYCLE,
    "postAttachCommand": _LIFECYCLE,
    "updateContentCommand": _LIFECYCLE,
    "waitFor": _LIFECYCLE,
    "overrideCommand": "a sandbox's processes are forgehand's own",
    "shutdownAction": "a sandbox's processes are forgehand's own",
    "hostRequirements": "a sandbox's resources are forgehand's limits",
}


def parse_devcontainer(
    data: bytes | str, *, allowed_images: Collection[str], source: str = DEVCONTAINER_FILES[0]
) -> EnvironmentSpec:
    """The supported subset of a devcontainer.json (module doc), or EnvironmentRefused."""
    text = read_text(data)
    try:
        doc = json.loads(strip_jsonc(text))
    except ValueError as exc:
        raise EnvironmentRefused([f"not valid JSON: {one_line(str(exc))}"]) from None
    if not isinstance(doc, dict):
        raise EnvironmentRefused(["the file must be a JSON object"])
    problems: list[str] = []
    for key in doc:
        if key in _DEVCONTAINER_IGNORED or key in _DEVCONTAINER_USED:
            continue
        reason = _DEVCONTAINER_REFUSED.get(key, "not supported by forgehand's environments")
        problems.append(f"`{key}`: {reason}")
    fields: dict[str, Any] = {}
    if "image" in doc:
        fields["image"] = doc["image"]
    setup = [
        _lifecycle_script(name, doc[name], problems) for name in ("onCreateCommand", "postCreateCommand") if name in doc
    ]
    if setup:
        fields["setup"] = "\n".join(part for part in setup if part)
    if "containerEnv" in doc:
        fields["env"] = doc["containerEnv"]
    fields.update(_forgehand_customizations(doc.get("customizations"), problems))
    return checked_spec(fields, allowed_images, problems, source=source)


_CUSTOMIZATION_KEYS = ("setup_egress", "setup_secrets", "cache_files", "timeout_seconds")


def _forgehand_customizations(value: object, problems: list[str]) -> dict[str, Any]:
    """`customizations.forgehand` (the devcontainer spec's place for a tool's own settings): the
    keys of environment.yml a devcontainer has no word for. Other tools' customizations are theirs."""
    if not isinstance(value, dict) or "forgehand" not in value:
        return {}
    own = value["forgehand"]
    if not isinstance(own, dict):
        problems.append("`customizations.forgehand`: must be an object")
        return {}
    problems.extend(
        f"`customizations.forgehand.{key}`: unknown key (one of {', '.join(_CUSTOMIZATION_KEYS)})"
        for key in own
        if key not in _CUSTOMIZATION_KEYS
    )
    return {key: own[key] for key in _CUSTOMIZATION_KEYS if key in own}


def _lifecycle_script(name: str, value: object, problems: list[str]) -> str:
    """A devcontainer lifecycle command as shell text: a string as is, a list (exec form) quoted,
    an object's commands one after the other (the devcontainer spec runs them in parallel; a setup
    that depends on that is rare, and in order is what a shell script does)."""
    if isinstance(value, dict):
        parts = [_command_text(f"{name}.{key}", command, problems) for key, command in value.items()]
        return "\n".join(part for part in parts if part)
    return _command_text(name, value, problems)


def _command_text(where: str, value: object, problems: list[str]) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(arg, str) for arg in value):
        return shlex.join(value)
    problems.append(f"`{where}`: must be a string, a list of strings or an object of named commands")
    return ""


def strip_jsonc(text: str) -> str:
    """JSON with comments (// and /* */, outside strings) and trailing commas, as plain JSON."""
    return _drop_trailing_commas(_drop_comments(text))


def _drop_comments(text: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == '"':
            end = _string_end(text, i)
            out.append(text[i:end])
            i = end
        elif text.startswith("//", i):
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = n if close < 0 else close + 2
            out.append(" ")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


_CLOSES_NEXT = re.compile(r"\s*[\]}]")


def _drop_trailing_commas(text: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == '"':
            end = _string_end(text, i)
            out.append(text[i:end])
            i = end
            continue
        if text[i] != "," or not _CLOSES_NEXT.match(text, i + 1):
            out.append(text[i])
        i += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    """The index just past the JSON string that opens at `start` (the end of text if unclosed)."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return len(text)

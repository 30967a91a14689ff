"""Hardened Docker sandboxes. Imports nothing from forge, tasks or webhooks.

    async with SandboxEngine() as engine:                      # connects on first use
        await engine.ensure_image()                            # cached; `forgehand sandbox build`
        await engine.ensure_agents_image()                     # `forgehand sandbox build --agents`
        await engine.require_agent("claude-code")              # its version, or AgentMissing
        ws = prepare_workspace(path, limit_bytes=GiB)          # its own 1 GiB filesystem (root)
        spec = SandboxSpec(image=DEFAULT_IMAGE, workspace=ws,
                           instance="inst", task="t1", run="r1")
        async with await engine.start(spec) as sb:             # removed on exit
            result = await sb.exec(["pytest", "-q"], timeout=300, output_cap=1 << 20)
            async with sb.stream(["make"]) as s:                # live output
                async for chunk in s: ...                      # OutputChunk(stream, data)
            s.result                                           # ExecResult
            async with sb.spawn(["cat"], timeout=60) as p:     # interactive: stdin open
                await p.write(b"hi\n"); await p.close_stdin()
                async for line in p.stdout_lines(): ...        # bytes lines (a CutLine past the cap)
            await p.wait()                                     # exit code (or None)
            sb.disk_limit_reached                              # the workspace was seen full
        remove_workspace(ws)                                   # unmounts, deletes the image
        await reap(engine, "inst", keep={"r2"})                # after a crash, periodically;
                                                               # also any whose creator is gone

The defaults and what each one stops: docs/security.md.

Every name is imported on first use (PEP 562), so that importing one light module of the package
(`sandbox.cli` for `forgehand sandbox --help`, `sandbox.errors`) does not load the Docker SDK.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .box import Sandbox
    from .commands import ExecResult, ExecStream
    from .engine import SandboxEngine
    from .errors import (
        AgentMissing,
        EngineUnavailable,
        ImageBuildFailed,
        ImageMissing,
        ProcessEnded,
        RelayFailed,
        SandboxError,
        SandboxGone,
        SpecRefused,
        WorkspaceFileTooLarge,
        WorkspacePathRefused,
        WorkspaceQuotaUnavailable,
    )
    from .images.agents_image import (
        AGENT_PINS,
        AGENTS_IMAGE_VERSION,
        DEFAULT_AGENTS_IMAGE,
        AgentPin,
        build_agents_image,
        installed_agents,
        require_agent,
    )
    from .images.building import BuildResult
    from .images.sandbox_image import DEFAULT_IMAGE, IMAGE_VERSION, build_image
    from .pool import SandboxPool, sweep_pool_dirs
    from .process import CutLine, SandboxProcess, truncated
    from .pump import OutputChunk
    from .quota import QuotaKind, WorkspaceUsage, quota_mounts, quota_unavailable_reason, workspace_usage
    from .reaper import SandboxInfo, list_sandboxes, reap
    from .spec import (
        CHANNEL_DIR,
        EGRESS_PROXY_PORT,
        GATEWAY_RELAY_PORT,
        HOSTS_FILE_NAME,
        GiB,
        Limits,
        MiB,
        Relay,
        SandboxSpec,
        Weakenings,
        container_create_kwargs,
        validate_spec,
        weakenings_in_effect,
    )
    from .workspace import (
        WorkspaceEntry,
        list_workspace,
        prepare_workspace,
        read_workspace_file,
        remove_workspace,
        write_workspace_file,
    )

__all__ = [
    "AGENTS_IMAGE_VERSION",
    "AGENT_PINS",
    "CHANNEL_DIR",
    "DEFAULT_AGENTS_IMAGE",
    "DEFAULT_IMAGE",
    "EGRESS_PROXY_PORT",
    "GATEWAY_RELAY_PORT",
    "HOSTS_FILE_NAME",
    "IMAGE_VERSION",
    "AgentMissing",
    "AgentPin",
    "BuildResult",
    "CutLine",
    "EngineUnavailable",
    "ExecResult",
    "ExecStream",
    "GiB",
    "ImageBuildFailed",
    "ImageMissing",
    "Limits",
    "MiB",
    "OutputChunk",
    "ProcessEnded",
    "QuotaKind",
    "Relay",
    "RelayFailed",
    "Sandbox",
    "SandboxEngine",
    "SandboxError",
    "SandboxGone",
    "SandboxInfo",
    "SandboxPool",
    "SandboxProcess",
    "SandboxSpec",
    "SpecRefused",
    "Weakenings",
    "WorkspaceEntry",
    "WorkspaceFileTooLarge",
    "WorkspacePathRefused",
    "WorkspaceQuotaUnavailable",
    "WorkspaceUsage",
    "build_agents_image",
    "build_image",
    "container_create_kwargs",
    "installed_agents",
    "list_sandboxes",
    "list_workspace",
    "prepare_workspace",
    "quota_mounts",
    "quota_unavailable_reason",
    "read_workspace_file",
    "reap",
    "remove_workspace",
    "require_agent",
    "sweep_pool_dirs",
    "truncated",
    "validate_spec",
    "weakenings_in_effect",
    "workspace_usage",
    "write_workspace_file",
]

_LAZY = {
    "AGENTS_IMAGE_VERSION": "images.agents_image",
    "AGENT_PINS": "images.agents_image",
    "AgentMissing": "errors",
    "AgentPin": "images.agents_image",
    "BuildResult": "images.building",
    "CHANNEL_DIR": "spec",
    "CutLine": "process",
    "DEFAULT_AGENTS_IMAGE": "images.agents_image",
    "DEFAULT_IMAGE": "images.sandbox_image",
    "EGRESS_PROXY_PORT": "spec",
    "EngineUnavailable": "errors",
    "HOSTS_FILE_NAME": "spec",
    "ExecResult": "commands",
    "ExecStream": "commands",
    "GATEWAY_RELAY_PORT": "spec",
    "GiB": "spec",
    "IMAGE_VERSION": "images.sandbox_image",
    "ImageBuildFailed": "errors",
    "ImageMissing": "errors",
    "Limits": "spec",
    "MiB": "spec",
    "OutputChunk": "pump",
    "ProcessEnded": "errors",
    "QuotaKind": "quota",
    "Relay": "spec",
    "RelayFailed": "errors",
    "Sandbox": "box",
    "SandboxEngine": "engine",
    "SandboxError": "errors",
    "SandboxGone": "errors",
    "SandboxInfo": "reaper",
    "SandboxPool": "pool",
    "SandboxProcess": "process",
    "SandboxSpec": "spec",
    "SpecRefused": "errors",
    "Weakenings": "spec",
    "WorkspaceEntry": "workspace",
    "WorkspaceFileTooLarge": "errors",
    "WorkspacePathRefused": "errors",
    "WorkspaceQuotaUnavailable": "errors",
    "WorkspaceUsage": "quota",
    "build_agents_image": "images.agents_image",
    "build_image": "images.sandbox_image",
    "container_create_kwargs": "spec",
    "installed_agents": "images.agents_image",
    "list_sandboxes": "reaper",
    "list_workspace": "workspace",
    "prepare_workspace": "workspace",
    "quota_mounts": "quota",
    "quota_unavailable_reason": "quota",
    "read_workspace_file": "workspace",
    "reap": "reaper",
    "remove_workspace": "workspace",
    "require_agent": "images.agents_image",
    "sweep_pool_dirs": "pool",
    "truncated": "process",
    "validate_spec": "spec",
    "weakenings_in_effect": "spec",
    "workspace_usage": "quota",
    "write_workspace_file": "workspace",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sandbox.{module}"), name)
    globals()[name] = value
    return value

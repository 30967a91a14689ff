"""Hardened Docker sandboxes. Imports nothing from forge, tasks or webhooks.

    async with SandboxEngine() as engine:                      # connects on first use
        await engine.ensure_image()                            # cached; `forgehand sandbox build`
        spec = SandboxSpec(image=DEFAULT_IMAGE, workspace=prepare_workspace(path),
                           instance="inst", task="t1", run="r1")
        async with await engine.start(spec) as sb:             # removed on exit
            result = await sb.exec(["pytest", "-q"], timeout=300, output_cap=1 << 20)
            async with sb.stream(["make"]) as s:                # live output
                async for chunk in s: ...                      # OutputChunk(stream, data)
            s.result                                           # ExecResult
        await reap(engine, "inst", keep={"r2"})                # after a crash, periodically

The defaults and what each one stops: docs/security.md.
"""

from .engine import Sandbox, SandboxEngine
from .errors import (
    EngineUnavailable,
    ImageBuildFailed,
    ImageMissing,
    SandboxError,
    SandboxGone,
    SpecRefused,
    WorkspaceFileTooLarge,
    WorkspacePathRefused,
)
from .execution import ExecResult, ExecStream, OutputChunk
from .image import DEFAULT_IMAGE, IMAGE_VERSION, BuildResult, build_image
from .pool import SandboxPool
from .reaper import SandboxInfo, list_sandboxes, reap
from .spec import (
    GiB,
    Limits,
    MiB,
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
    write_workspace_file,
)

__all__ = [
    "DEFAULT_IMAGE",
    "IMAGE_VERSION",
    "BuildResult",
    "EngineUnavailable",
    "ExecResult",
    "ExecStream",
    "GiB",
    "ImageBuildFailed",
    "ImageMissing",
    "Limits",
    "MiB",
    "OutputChunk",
    "Sandbox",
    "SandboxEngine",
    "SandboxError",
    "SandboxGone",
    "SandboxInfo",
    "SandboxPool",
    "SandboxSpec",
    "SpecRefused",
    "Weakenings",
    "WorkspaceEntry",
    "WorkspaceFileTooLarge",
    "WorkspacePathRefused",
    "build_image",
    "container_create_kwargs",
    "list_sandboxes",
    "list_workspace",
    "prepare_workspace",
    "read_workspace_file",
    "reap",
    "validate_spec",
    "weakenings_in_effect",
    "write_workspace_file",
]

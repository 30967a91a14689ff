"""Hardened Docker sandboxes. Imports nothing from forge, tasks or webhooks."""

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

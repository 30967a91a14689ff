"""Typed errors. Each carries a hint an operator can act on."""


class SandboxError(Exception):
    """Base class of every error this package raises."""

    hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} (hint: {self.hint})" if self.hint else base


class EngineUnavailable(SandboxError):
    """No Docker engine answered."""

    hint = "start Docker (e.g. `systemctl start docker` or `dockerd &`) and check DOCKER_HOST"


class ImageMissing(SandboxError):
    """The sandbox image is not on the engine."""

    hint = "run `forgehand sandbox build`"


class AgentMissing(ImageMissing):
    """The agents image is not on the engine, or lacks the agent a task asks for."""

    hint = "run `forgehand sandbox build --agents`"


class SpecRefused(SandboxError):
    """The spec is unsafe or malformed, or the engine refused it."""


class RelayFailed(SandboxError):
    """A relay of the spec (`SandboxSpec.relays`) could not start: the sandbox is not started."""

    hint = "the image needs python3, and the relay ports must be free in the container"


class SandboxGone(SandboxError):
    """The container no longer exists or is not running (stopped, removed, wall clock passed)."""


class ProcessEnded(SandboxError):
    """An interactive process no longer takes input: its stdin was closed or it has exited."""


class ImageBuildFailed(SandboxError):
    """A recipe step failed while building the sandbox image."""


class WorkspacePathRefused(SandboxError):
    """A host-side workspace path is absolute, climbs out, crosses a symlink or names a non-file."""


class WorkspaceFileTooLarge(SandboxError):
    """A workspace file is larger than the caller's cap."""


class WorkspaceQuotaUnavailable(SandboxError):
    """A size-limited workspace cannot be mounted here (not root, no loop device, a tool failed)."""

    hint = (
        "run forgehand as root on a host with loop devices, or use the documented watchdog fallback "
        "(weaker: a fast writer can pass the limit before it looks)"
    )


class EnvironmentRefused(SandboxError):
    """A repository's environment declaration is malformed or asks for something a sandbox never
    allows. `problems` lists every one of them (nothing of the declaration is used)."""

    hint = "fix each listed problem in the environment file (docs/architecture/sandbox.md, Environments)"

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("the environment was refused: " + "; ".join(self.problems))

"""What a run opens toward the outside of its sandbox before the sandbox starts, a step of
`Execution` (tasks/run/execution.py): the image (checked to hold the agent), the model gateway
with the back-channel on its socket, the egress proxy when the repository allows network access,
and the loopback relays that reach them from inside the container."""

from pathlib import Path
from typing import Any

from sqlalchemy import update

from forge.core.settings import Settings
from forge.db.payload_base import TriggerRef
from sandbox import DEFAULT_AGENTS_IMAGE, GATEWAY_RELAY_PORT, AgentMissing, EngineUnavailable, Relay
from tasks.core.egress_config import EgressPlan
from tasks.core.models import Run
from tasks.core.repo_settings import Provider, ProviderAccess
from tasks.core.states import FailureReason
from tasks.core.writer import TranscriptWriter
from tasks.run.backchannel import Backchannel, attach
from tasks.run.egress import RunEgress, blocked_notifier, open_run_egress
from tasks.run.env import RunEnv
from tasks.run.gateway import SOCKET_NAME, ChannelUnavailable, RunChannel, build_channel, provider_of
from tasks.run.runtimes.base import ModelEndpoint


class ProvisionFailed(Exception):
    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Outside:
    """The run's channels out of the sandbox (what `Execution` loaded and holds, declared here)."""

    env: RunEnv
    settings: Settings
    access: dict[Provider, ProviderAccess]
    task_id: int
    run_id: int
    run_uuid: str
    repo_id: int
    writer: TranscriptWriter | None
    channel: RunChannel | None
    egress: RunEgress | None
    backchannel: Backchannel | None
    trigger: TriggerRef | None

    async def image_for(self, runtime: Any) -> str:
        """The plain sandbox image, or for a CLI agent runtime (`image_kind() == "agents"`) the agents
        image, which must hold that agent: checked from its labels before any container starts."""
        kind = getattr(runtime, "image_kind", None)
        if kind is None or kind() != "agents":
            return self.env.image
        own = getattr(runtime, "image", "")  # an operator's image for its agent: used as given
        if own:
            return str(own)
        image = self.env.agents_image or DEFAULT_AGENTS_IMAGE
        label = getattr(runtime, "agent_label", runtime.name)  # "" = an operator's agent: no label
        try:
            if label:
                await self.env.engine.require_agent(label, image)
        except AgentMissing as exc:
            raise ProvisionFailed(
                FailureReason.IMAGE_MISSING, f"{exc}: run `forgehand sandbox build --agents`"
            ) from exc
        except EngineUnavailable as exc:
            raise ProvisionFailed(FailureReason.ENGINE_UNAVAILABLE, f"no Docker engine answered: {exc}") from exc
        return image

    async def _open_channel(self, runtime: Any) -> ModelEndpoint:
        """The run's model gateway, before the sandbox starts (directory, socket, token); the run
        records which provider it speaks and whose key pays."""
        provider = provider_of(runtime)
        try:
            channel = build_channel(
                self.settings, self.access, provider, task_id=self.task_id, run_id=self.run_id,
                run_uuid=self.run_uuid, emit=self._emit, db=self.env.db,
            )  # fmt: skip
        except ChannelUnavailable as exc:
            raise ProvisionFailed(FailureReason.MODEL_UNREACHABLE, str(exc)) from exc
        self.channel = channel
        try:
            await channel.start()
        except (OSError, RuntimeError) as exc:
            raise ProvisionFailed(FailureReason.INTERNAL, f"the run's model gateway could not start: {exc}") from exc
        await self._set_run(model_key=channel.provider.model_key, model_provider=provider)
        assert self.writer is not None
        budget = channel.budget
        self.backchannel = Backchannel(
            db=self.env.db, lifecycle=self.env.lifecycle, settings=self.settings, task_id=self.task_id,
            run_id=self.run_id, emit=self._emit, redact=self.writer.redactor.redact,
            runtimes=frozenset(self.env.runtimes),
            remaining=lambda: max(0, budget.limit - budget.used) if budget.limit else None,
            charge=budget.grant, store=self.env.store, review_pull=self._review_pull(),
        )  # fmt: skip
        attach(channel, self.backchannel)
        model = self.access[provider].model
        timeout = self.settings.model_timeout_seconds
        return ModelEndpoint(base_url="http://gateway/v1", model=model, api_key=channel.token, timeout=timeout,
                             uds=str(channel.socket_path))  # fmt: skip

    def _review_pull(self) -> int | None:
        """A review task's pull request (its trigger's): its run is offered `submit_review`."""
        trigger = self.trigger
        if trigger is None or trigger.kind != "review_request" or trigger.pull_request is None:
            return None
        return trigger.pull_request.number

    async def _open_egress(self, plan: EgressPlan) -> RunEgress:
        """The run's egress proxy, before the sandbox starts (the repository allows network access)."""
        try:
            self.egress = await open_run_egress(
                plan, self.channel.host_dir if self.channel is not None else None,
                self.env.settings.effective_run_channel_dir, self.run_uuid, emit=self._emit,
                notify=blocked_notifier(self.env, self.task_id, self.repo_id, self.run_id),
            )  # fmt: skip
        except OSError as exc:
            raise ProvisionFailed(FailureReason.INTERNAL, f"the run's egress proxy could not start: {exc}") from exc
        return self.egress

    def _relays(self) -> tuple[Relay, ...]:
        """The gateway's loopback relay whenever the run has a channel (a TCP base URL for codex, the
        back-channel's MCP URL for every CLI), and the egress proxy's when the repository allows it."""
        relays = [Relay(GATEWAY_RELAY_PORT, SOCKET_NAME)] if self.channel is not None else []
        if self.egress is not None:
            relays.append(self.egress.relay)
        return tuple(relays)

    def _channel_dir(self) -> Path | None:
        if self.channel is not None:
            return self.channel.host_dir
        return self.egress.host_dir if self.egress is not None else None

    async def _emit(self, kind: Any, payload: Any) -> None:
        assert self.writer is not None
        await self.writer.emit(kind, payload)

    async def _emit_many(self, events: Any) -> None:
        assert self.writer is not None
        await self.writer.emit_many(events)

    async def _set_run(self, **values: Any) -> None:
        async with self.env.db.session(write=True) as s:
            await s.execute(
                update(Run).where(Run.id == self.run_id).values(**values).execution_options(synchronize_session=False)
            )

"""Wire shapes of schedules (msgspec structs): what a repository admin sends to create or change
one, and what the API answers. New fields get defaults; types never change."""

from datetime import datetime
from typing import Annotated

import msgspec
from msgspec import UNSET, UnsetType

from tasks.core.schemas import GOAL_MAX, RuntimeName

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
Cron = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
Zone = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Goal = Annotated[str, msgspec.Meta(max_length=GOAL_MAX)]
Agent = Annotated[str, msgspec.Meta(min_length=1, max_length=40)]
Command = (
    Annotated[str, msgspec.Meta(max_length=10_000)]
    | Annotated[list[Annotated[str, msgspec.Meta(max_length=10_000)]], msgspec.Meta(max_length=1000)]
    | None
)
Base = Annotated[str, msgspec.Meta(max_length=255)]
Title = Annotated[str, msgspec.Meta(max_length=200)]
AgentCommand = Annotated[str, msgspec.Meta(max_length=40)] | None


class ScheduleCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A recurring task: at each time of `cron` (5 fields) in `timezone`, a task with these fields
    (as `POST .../tasks` takes them) starts, started by the person who saved the schedule."""

    name: Name
    cron: Cron
    goal: Goal
    agent: Agent
    timezone: Zone = "UTC"
    runtime: RuntimeName | None = None
    command: Command = None
    agent_command: AgentCommand = None
    base: Base = ""  # "": the repository's default branch at each run
    title: Title = ""
    paused: bool = False


class ScheduleUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A change: absent fields stay as they are. Changing what runs (goal, agent, runtime, command,
    agent_command, base, title) makes the person who changes it the schedule's starter."""

    name: Name | UnsetType = UNSET
    cron: Cron | UnsetType = UNSET
    timezone: Zone | UnsetType = UNSET
    goal: Goal | UnsetType = UNSET
    agent: Agent | UnsetType = UNSET
    runtime: RuntimeName | UnsetType | None = UNSET
    command: Command | UnsetType = UNSET
    agent_command: AgentCommand | UnsetType = UNSET
    base: Base | UnsetType = UNSET
    title: Title | UnsetType = UNSET
    paused: bool | UnsetType = UNSET


class TaskLink(msgspec.Struct, kw_only=True):
    number: int
    html_url: str


class ScheduleRead(msgspec.Struct, kw_only=True):
    id: int
    name: str
    cron: str
    timezone: str
    goal: str
    title: str
    agent: str | None
    runtime: str
    command: str | list[str] | None
    agent_command: str | None
    base: str
    paused: bool
    starter: str | None  # whose tasks the runs are (their rights are checked at each run)
    next_run_at: datetime | None  # null while paused
    last_run_at: datetime | None  # the last slot taken, whether it started a task or was skipped
    last_task: TaskLink | None  # the last task it started: {number, html_url}
    last_skip_reason: str  # why the last slot started nothing ("" when it started a task)
    html_url: str
    created_at: datetime
    updated_at: datetime

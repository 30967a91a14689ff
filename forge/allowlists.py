"""The allow-lists of hosts that user-configured endpoints may use although the address rules
(forge.addresses) refuse them: `model` (model endpoints set in a repository's task settings or in
a personal key) and `webhooks` (webhook and policy endpoints). The operator's environment
variables (`FORGEHAND_MODEL_ALLOWED_HOSTS`, `FORGEHAND_WEBHOOKS_ALLOWED_HOSTS`) are the floor:
always allowed."""

from typing import Literal

from sqlalchemy.ext.asyncio import AsyncSession

from forge.addresses import AllowList
from forge.settings import Settings

ListName = Literal["model", "webhooks"]
LISTS: dict[ListName, str] = {"model": "model_allowed_hosts", "webhooks": "webhooks_allowed_hosts"}


def env_name(name: ListName) -> str:
    return "FORGEHAND_" + LISTS[name].upper()


def floor(settings: Settings, name: ListName) -> AllowList:
    """The operator's list (the environment); ValueError names the variable."""
    return AllowList.parse(getattr(settings, LISTS[name]), setting=env_name(name))


async def current(session: AsyncSession, settings: Settings, name: ListName) -> AllowList:
    """The list as it is now, for a check when something is saved."""
    del session  # the lists an instance admin keeps join here
    return floor(settings, name)

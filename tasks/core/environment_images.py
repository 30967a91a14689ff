"""The images an environment may name (docs/environments.md, "Images"): the built-in ones, the
operator's (FORGEHAND_ENVIRONMENT_EXTRA_IMAGES) and those an instance admin registered. Shared by
the services that check a declaration and by the run that builds it."""

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.settings import Settings
from sandbox import DEFAULT_AGENTS_IMAGE, DEFAULT_IMAGE
from tasks.core.models import EnvironmentImage


def operator_images(settings: Settings) -> list[str]:
    """The operator's images (FORGEHAND_ENVIRONMENT_EXTRA_IMAGES)."""
    return [i.strip() for i in settings.environment_extra_images.split(",") if i.strip()]


def built_in_and_operators(settings: Settings) -> set[str]:
    """The images every environment may name without a registration."""
    return {"sandbox", "agents", DEFAULT_IMAGE, DEFAULT_AGENTS_IMAGE, *operator_images(settings)}


async def registered(session: AsyncSession) -> list[str]:
    return list((await session.scalars(select(EnvironmentImage.reference).order_by(EnvironmentImage.id))).all())


async def allowed_images(session: AsyncSession, settings: Settings) -> set[str]:
    """Built-in, the operator's and the registered images: those an environment may name."""
    return built_in_and_operators(settings) | set(await registered(session))

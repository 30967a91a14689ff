"""Admin > Environment images: the local images an environment may start from (docs/environments.md,
"Images"). The built-in ones and the operator's (FORGEHAND_ENVIRONMENT_EXTRA_IMAGES) are shown
read-only; an instance admin registers and removes the rest, through the same service as
`/api/v1/admin/environment-images` (each change audited). A task page, not a forge one (forge
imports nothing of tasks): the admin area's nav links here by its path."""

from typing import Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.errors import ForgeError
from forge.http.deps import ActorDep, DbSession, SettingsDep
from forge.http.pages.common import WebForm, instance_admin, or_form_error, page
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors
from tasks.core.environment_images import operator_images
from tasks.services import environment_images
from tasks.services.environment_images import EnvironmentImageCreate

PATH = "/admin/environment-images"
# What a refusal can name (its code) -> the form's input.
ALIASES = {"invalid_environment_image": "reference", "conflict": "reference", "invalid_characters": "note"}


class RegisterImageForm(WebForm):
    reference: str = ""
    note: str = ""


class EnvironmentImagePages(Controller):
    path = PATH
    include_in_schema = False
    guards = [instance_admin]

    async def _render(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        *,
        form: RegisterImageForm | None = None,
        errors: FormErrors = NO_ERRORS,
        status_code: int = 200,
    ) -> Template:
        return page(
            request,
            "tasks/admin_environment_images.html",
            status_code=status_code,
            built_in=("sandbox", "agents"),
            operator=operator_images(settings),
            images=await environment_images.list_images(db_session, actor),
            form=form or RegisterImageForm(),
            errors=errors,
        )

    @get("/")
    async def images_page(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, settings: SettingsDep
    ) -> Template:
        return await self._render(request, db_session, actor, settings)

    @post("/")
    async def register(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        data: URLEncodedBody[RegisterImageForm],
    ) -> Template | Redirect:
        change = EnvironmentImageCreate(reference=data.reference[:255], note=data.note[:200])

        async def again(exc: ForgeError) -> Template:
            # Nothing of the refused registration is kept; what was typed stays in the form.
            await db_session.rollback()
            errors = form_errors(exc, ("reference", "note"), ALIASES)
            return await self._render(
                request, db_session, actor, settings, form=data, errors=errors, status_code=exc.status
            )

        added = await or_form_error(environment_images.register(db_session, actor, change), again)
        if isinstance(added, Template):
            return added
        return Redirect(f"{PATH}/#image-{added.id}", status_code=303)

    @post("/{image_id:int}/remove")
    async def remove(self, db_session: DbSession, actor: ActorDep, image_id: FromPath[int]) -> Redirect:
        await environment_images.unregister(db_session, actor, image_id)
        return Redirect(f"{PATH}/", status_code=303)

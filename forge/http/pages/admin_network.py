"""Admin > Network: the hosts model endpoints and webhooks may use although the address rules
refuse them (loopback, private, link-local...). The operator's environment variables are shown
read-only (the floor); an instance admin adds and removes the rest, through the same service as
`/api/v1/admin/allowed-hosts`, in force at once."""

from typing import Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.errors import ForgeError
from forge.db import allowlists
from forge.http.deps import ActorDep, DbSession, SettingsDep
from forge.http.pages.common import WebForm, instance_admin, or_form_error, page


class AllowHostForm(WebForm):
    host: str = ""
    note: str = ""


class NetworkPages(Controller):
    path = "/admin/network"
    include_in_schema = False
    guards = [instance_admin]

    async def _render(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        settings: SettingsDep,
        status_code: int = 200,
        **extra: Any,
    ) -> Template:
        lists = [await allowlists.read(db_session, settings, name) for name in allowlists.LISTS]
        return page(request, "admin_network.html", status_code=status_code, lists=lists, **extra)

    @get("/")
    async def network_page(
        self, request: Request[Any, Any, Any], db_session: DbSession, settings: SettingsDep
    ) -> Template:
        return await self._render(request, db_session, settings)

    @post("/{list_name:str}")
    async def allow(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        list_name: FromPath[str],
        data: URLEncodedBody[AllowHostForm],
    ) -> Template | Redirect:
        name = allowlists.require_list(list_name)
        change = allowlists.AllowedHostCreate(host=data.host[:255], note=data.note[:200])

        async def again(exc: ForgeError) -> Template:
            # What was typed stays in its form, the error beside it.
            return await self._render(
                request, db_session, settings, refused=exc, errors={name: exc.detail}, typed={name: data}
            )

        added = await or_form_error(allowlists.add(db_session, settings, actor, name, change), again)
        if isinstance(added, Template):
            return added
        return Redirect(f"/admin/network/#allow-{name}", status_code=303)

    @post("/{list_name:str}/{entry_id:int}/remove")
    async def remove(
        self, db_session: DbSession, actor: ActorDep, list_name: FromPath[str], entry_id: FromPath[int]
    ) -> Redirect:
        name = allowlists.require_list(list_name)
        await allowlists.remove(db_session, actor, name, entry_id)
        return Redirect(f"/admin/network/#allow-{name}", status_code=303)

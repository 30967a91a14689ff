"""The "model access" section of a person's settings: their own model keys per provider, set or
removed in the browser through the same service as `/api/v1/user/model-keys` (write-only: the
page says whether a key is set and its last four characters at most)."""

from typing import Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect, Template

from forge.accounts import model_keys
from forge.core.errors import ForgeError
from forge.db.models import Account
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, DbSession, SettingsDep
from forge.http.pages.common import WebForm, or_form_error, page
from forge.http.pages.forms import form_errors


async def _me(db_session: DbSession, actor: ActorDep) -> Account:
    me = await db_session.get(Account, actor.principal.account_id)
    assert me is not None  # the `signed_in` guard ran
    return me


class ModelKeyForm(WebForm):
    api_key: str = ""
    base_url: str = ""
    model: str = ""


# The key service's refusals (their codes) -> the input they concern, by its name in the form.
ALIASES = {
    "invalid_model_key": "api_key",
    "invalid_model_url": "base_url",
    "host_not_allowed": "base_url",
    "invalid_model_name": "model",
}


def card_aliases(provider: str) -> dict[str, str]:
    """`ALIASES` to the ids of one provider's card (`base_url_openai`): both cards are on one page."""
    return {code: f"{name}_{provider}" for code, name in ALIASES.items()}


class ModelKeyPages(Controller):
    path = "/settings/model-keys"
    include_in_schema = False
    guards = [signed_in]

    async def _render(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        status_code: int = 200,
        **extra: Any,
    ) -> Template:
        me = await _me(db_session, actor)
        keys = await model_keys.list_for(db_session, me)
        return page(request, "model_keys.html", status_code=status_code, keys=keys, **extra)

    @get("/")
    async def keys_page(self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep) -> Template:
        return await self._render(request, db_session, actor)

    @post("/{provider:str}")
    async def save(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        provider: FromPath[str],
        data: URLEncodedBody[ModelKeyForm],
    ) -> Template | Redirect:
        me = await _me(db_session, actor)
        change = model_keys.ModelKeyPut(
            api_key=data.api_key[:4096],
            base_url=data.base_url.strip()[:500] or None,
            model=data.model.strip()[:200] or None,
        )

        async def again(exc: ForgeError) -> Template:
            # Shown again as typed, the refusal in the provider's own card beside the field it
            # concerns (the key itself is never echoed back: the person types it again).
            inputs = [f"{name}_{provider}" for name in ModelKeyForm.__struct_fields__]
            errors = form_errors(exc, inputs, card_aliases(provider))
            typed = {"provider": provider, "base_url": data.base_url, "model": data.model}
            return await self._render(request, db_session, actor, refused=exc, typed=typed, errors=errors)

        # A 404 (no such provider) stays a 404: there is no card to show it in.
        saved = await or_form_error(model_keys.put(db_session, settings, actor, me, provider, change), again)
        if isinstance(saved, Template):
            return saved
        return Redirect("/settings/model-keys/", status_code=303)

    @post("/{provider:str}/remove")
    async def remove(self, db_session: DbSession, actor: ActorDep, provider: FromPath[str]) -> Redirect:
        me = await _me(db_session, actor)
        await model_keys.remove(db_session, actor, me, provider)
        return Redirect("/settings/model-keys/", status_code=303)

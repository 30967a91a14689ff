"""REST: repository secrets at GitHub's Actions secrets paths and in its shapes
(forge/repos/repo_secrets.py). Repository admins only; a value is never returned."""

from typing import Annotated

import msgspec
from litestar import Controller, Response, delete, get, put
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, JSONBody
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action
from forge.core.settings import Settings
from forge.http.deps import ActorDep, DbSession, PathRepoDep, SettingsDep
from forge.repos.repo_secrets import RepoSecrets, SecretList, SecretRead, secret_box

SECRETS = "/api/v1/repos/{owner:str}/{name:str}/actions/secrets"


class SecretPut(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # The value as is (GitHub takes `encrypted_value` sealed with the repository's public key):
    # it travels over the server's TLS and is encrypted at rest. The bound is the schema's; the
    # service refuses more than 48 KiB of UTF-8 with `secret_too_large`.
    value: Annotated[str, msgspec.Meta(max_length=200_000)]


def _secrets(session: AsyncSession, settings: Settings) -> RepoSecrets:
    return RepoSecrets(session, secret_box(settings))


class RepoSecretController(Controller):
    path = SECRETS
    tags = ["secrets"]

    @get("/", summary="A repository's secrets: names and dates, never values (repository admins)")
    async def list_secrets(self, db_session: DbSession, settings: SettingsDep, path_repo: PathRepoDep) -> SecretList:
        res = await path_repo.load(Action.REPO_ADMIN)
        return await _secrets(db_session, settings).list(res)

    @get("/{secret_name:str}", summary="One secret: its name and dates, never its value (repository admins)")
    async def get_secret(
        self, db_session: DbSession, settings: SettingsDep, path_repo: PathRepoDep, secret_name: FromPath[str]
    ) -> SecretRead:
        res = await path_repo.load(Action.REPO_ADMIN)
        return await _secrets(db_session, settings).get(res, secret_name)

    @put(
        "/{secret_name:str}",
        summary="Create (201) or replace (204) a secret; body {value} (repository admins)",
        status_code=201,
        responses={204: ResponseSpec(None, description="The secret existed: its value was replaced")},
    )
    async def put_secret(
        self,
        db_session: DbSession,
        settings: SettingsDep,
        actor: ActorDep,
        path_repo: PathRepoDep,
        secret_name: FromPath[str],
        data: JSONBody[SecretPut],
    ) -> Response[None]:
        res = await path_repo.load(Action.REPO_ADMIN)
        created = await _secrets(db_session, settings).put(actor, res, secret_name, data.value)
        return Response(None, status_code=201 if created else 204)

    @delete("/{secret_name:str}", summary="Delete a secret (repository admins)", status_code=204)
    async def delete_secret(
        self,
        db_session: DbSession,
        settings: SettingsDep,
        actor: ActorDep,
        path_repo: PathRepoDep,
        secret_name: FromPath[str],
    ) -> None:
        res = await path_repo.load(Action.REPO_ADMIN)
        await _secrets(db_session, settings).delete(actor, res, secret_name)

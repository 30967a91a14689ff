"""REST for the environment images instance admins register (docs/environments.md, "Images")."""

from litestar import Controller, delete, get, post
from litestar.params import FromPath, JSONBody

from forge.http.auth import signed_in
from forge.http.deps import ActorDep, DbSession
from tasks.services import environment_images
from tasks.services.environment_images import EnvironmentImageCreate, EnvironmentImageRead


class EnvironmentImageController(Controller):
    guards = [signed_in]  # an anonymous caller is asked to authenticate (401) before the body is read
    path = "/api/v1/admin/environment-images"
    tags = ["admin"]

    @get("/", summary="The local images environments may start from, as instance admins registered them")
    async def list_images(self, db_session: DbSession, actor: ActorDep) -> list[EnvironmentImageRead]:
        return await environment_images.list_images(db_session, actor)

    @post("/", summary="Register a local image environments may start from (instance admins)", status_code=201)
    async def register(
        self, db_session: DbSession, actor: ActorDep, data: JSONBody[EnvironmentImageCreate]
    ) -> EnvironmentImageRead:
        return await environment_images.register(db_session, actor, data)

    @delete("/{image_id:int}", summary="Unregister an environment image (its built environments stay cached)")
    async def unregister(self, db_session: DbSession, actor: ActorDep, image_id: FromPath[int]) -> None:
        await environment_images.unregister(db_session, actor, image_id)

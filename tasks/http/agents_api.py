"""REST for the agent registry: every runtime of this instance, its version, image and policy
layers, ACP agents one entry each (read by any signed-in person or token)."""

from litestar import Controller, get

from forge.http.auth import signed_in
from tasks.core.agent_registry import AgentList
from tasks.http.deps import DEPENDENCIES, SystemDep


class AgentController(Controller):
    tags = ["tasks"]
    dependencies = DEPENDENCIES

    @get(
        "/api/v1/agents",
        summary="The runtimes and ACP agents of this instance, with versions, images and policy layers",
        guards=[signed_in],
    )
    async def list_agents(self, task_system: SystemDep) -> AgentList:
        return AgentList(agents=await task_system.agent_registry())

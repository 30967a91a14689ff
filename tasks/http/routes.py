"""Every route handler of tasks, for the composition root (forge/app/factory.py)."""

from tasks.http.agents_api import AgentController
from tasks.http.approvals_api import ApprovalController
from tasks.http.environment_images_api import EnvironmentImageController
from tasks.http.events import TaskEventsController
from tasks.http.pages.environment_images import EnvironmentImagePages
from tasks.http.pages.reviews import ReviewPages
from tasks.http.pages.schedules import SchedulePages
from tasks.http.pages.settings import EnvironmentCheckPages, EnvironmentPages, TaskSettingsPages
from tasks.http.pages.tasks import MyTaskPages, TaskPages
from tasks.http.pages.tool_routes import AdminToolPages, RepoToolPages
from tasks.http.pages.workers import WorkerPages
from tasks.http.reviews_api import ReviewController
from tasks.http.schedules_api import ScheduleController
from tasks.http.settings_api import EnvironmentController, RepoTaskSettingsController
from tasks.http.tasks_api import EnvironmentCheckController, TaskController, UserTaskController
from tasks.http.tools_api import AdminToolController, RepoToolController
from tasks.http.workers_api import WorkerController

API_HANDLERS = [
    TaskController,
    TaskEventsController,
    ApprovalController,
    ReviewController,
    UserTaskController,
    RepoTaskSettingsController,
    EnvironmentController,
    EnvironmentCheckController,
    EnvironmentImageController,
    ScheduleController,
    RepoToolController,
    AdminToolController,
    AgentController,
    WorkerController,
]
PAGE_HANDLERS = [
    TaskPages,
    ReviewPages,
    TaskSettingsPages,
    EnvironmentPages,
    EnvironmentCheckPages,
    EnvironmentImagePages,
    SchedulePages,
    RepoToolPages,
    AdminToolPages,
    MyTaskPages,
    WorkerPages,
]

"""Requests in: the REST API and the web pages of webhook endpoints, both scopes (the instance and
a repository); `ROUTE_HANDLERS` is what the host mounts."""

from webhooks.http.api import InstanceHooksController, RepoHooksController
from webhooks.http.pages import InstanceHookPages, RepoHookPages

ROUTE_HANDLERS = [InstanceHooksController, RepoHooksController, InstanceHookPages, RepoHookPages]

__all__ = ["ROUTE_HANDLERS"]

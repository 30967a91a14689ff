"""The API reference page (`/api/schema/swagger`, also `/api/schema`): Swagger UI, whose files come
from the `swagger-ui-bundle-v2` package and are served by this instance under
`/static/api-reference/`. Litestar's own UI plugins load their scripts, styles and favicon from
CDNs; this one names only local files, reads the completed contract (`/api/schema/openapi.json`,
see `forge.http.api.contract`), and turns off Swagger UI's online validator, so the page never makes
a request that leaves the instance.

Speed: Litestar builds the OpenAPI document on the first request for it, in its (synchronous)
handler on the event loop: seconds, with every other request of the instance waiting. Here the
document and the completed contract are built once per process, in a worker thread
(`schema_ready`, awaited by the schema routes before their handler runs, and started at startup
by `forgehand serve`), and handed to Litestar's own cache, so its handlers answer at once."""

import asyncio
import html
import threading
from pathlib import Path
from typing import Any

import swagger_ui_bundle
from litestar import Litestar, Request, get
from litestar._openapi.plugin import OpenAPIPlugin
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.params import FromPath
from litestar.response import File

from forge.core.error_codes import Code
from forge.core.errors import NotFound
from forge.http.api.contract import ContractJsonPlugin, route_key

SCHEMA_PATH = "/api/schema"
# The description the reference opens with (markdown): for the person calling the API.
API_DESCRIPTION = """The REST API of this forgehand instance: repositories, collaborators and branch rules, files and
history, tasks (start, follow, answer, review, merge), webhooks, your tokens and model keys, and
instance administration. The web UI runs on the same services: what you can do there, you can
script here. Paths start with `/api/v1`; bodies are JSON.

**Authenticate with a token.** Create a personal access token under **Settings → Tokens** (an
admin makes a bot's under **Admin → Accounts**) with the scopes it needs (`repo:read`,
`repo:write`, `tasks:read`, `tasks:write`, `reviews:write`, `webhooks:admin`, `notifications`; `admin` for
instance administration), and send it with every request:

    curl -H "Authorization: Bearer fh_..." https://forge.example/api/v1/user

To try calls from this page, press **Authorize** and paste the token. Public repositories can be
read without one; git over HTTPS takes the same token as its password.

**Errors** come as `application/problem+json`: the HTTP `status`, a `detail` that says what to
fix, and a stable `code` to branch on. Every code, with its status and what it means, is listed
under **Schemas → Problem → code** at the bottom of this page (and in the documentation,
`docs/api.md`). A `429` or `503` answer carries `Retry-After`.

For client generators: the document itself, [`/api/schema/openapi.json`](/api/schema/openapi.json).
"""

# Litestar's OpenAPI document per route table (one per process in practice): see the docstring.
_documents: dict[tuple[str, ...], dict[str, Any]] = {}
_build_lock = threading.Lock()
_warming: set[asyncio.Task[None]] = set()


def _build(app: Litestar) -> dict[str, Any]:
    """Litestar's document for the app's routes and the completed contract (blocking: a thread)."""
    key = route_key(app)
    with _build_lock:
        document = _documents.get(key)
        if document is None:
            document = _documents[key] = app.plugins.get(OpenAPIPlugin).provide_openapi_schema()
    for plugin in app.openapi_config.render_plugins if app.openapi_config else ():
        if isinstance(plugin, ContractJsonPlugin):
            plugin.contract(app, document)
    return document


async def schema_ready(app: Litestar) -> None:
    """Make sure the app's OpenAPI document is built (in a worker thread, once per process) and in
    Litestar's cache, so the schema routes' own handlers do not build it on the event loop."""
    plugin = app.plugins.get(OpenAPIPlugin)
    if plugin._openapi_schema is not None:  # Litestar's cache: its handlers read it
        return
    document = _documents.get(route_key(app))
    if document is None:
        document = await asyncio.to_thread(_build, app)
    plugin._openapi_schema = document


def warm_up(app: Litestar) -> None:
    """Start building the document when the server starts (`forgehand serve`): the first visitor
    of the API reference then waits for nothing. Runs in the background, off the event loop."""

    async def start() -> None:
        task = asyncio.create_task(schema_ready(app), name="api-reference-warm-up")
        _warming.add(task)  # a reference, so the task is not collected before it ends
        task.add_done_callback(_warming.discard)

    app.on_startup.append(start)


ASSETS_PATH = "/static/api-reference"
SWAGGER_DIR = Path(swagger_ui_bundle.swagger_ui_path)
# Only the files the page uses: the package also holds Swagger's demo page, whose initializer
# loads the petstore from another origin, and a template.
ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-standalone-preset.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}


@get(f"{ASSETS_PATH}/{{name:str}}", include_in_schema=False, name="api-reference-assets")
async def api_reference_asset(name: FromPath[str]) -> File:
    media_type = ASSET_TYPES.get(name)
    if media_type is None:
        raise NotFound(f"no API reference asset {name!r}", code=Code.NOT_FOUND)
    return File(path=SWAGGER_DIR / name, media_type=media_type, content_disposition_type="inline")


API_REFERENCE_ASSETS = api_reference_asset


async def before_schema(request: Request[Any, Any, Any]) -> None:
    """`before_request` for the schema routes (`forge.http.edges`): the document is ready first."""
    path = request.url.path
    if path == SCHEMA_PATH or path.startswith(SCHEMA_PATH + "/"):
        await schema_ready(request.app)


class LocalSwaggerPlugin(SwaggerRenderPlugin):
    def __init__(self) -> None:
        super().__init__(
            path="/swagger",
            js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            css_url=f"{ASSETS_PATH}/swagger-ui.css",
            standalone_preset_js_url=f"{ASSETS_PATH}/swagger-ui-standalone-preset.js",
            favicon='<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">',
        )

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        title = html.escape(f"API reference · {openapi_schema['info']['title']}")
        return f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title}</title>
  {self.favicon}
  <link rel="stylesheet" href="{self.css_url}">
  <link rel="stylesheet" href="/static/forgehand.css">
  <script src="{self.js_url}"></script>
</head>
<body class="api-reference">
<header class="top api-top"><a class="brand" href="/">forgehand</a> <span>API reference</span>
  <a href="/api/schema/openapi.json">openapi.json</a></header>
<main id="swagger-container"></main>
<script>
  SwaggerUIBundle({{
    url: "/api/schema/openapi.json",
    dom_id: "#swagger-container",
    deepLinking: false,  // deep links put a link inside each operation's toggle button (nested controls)
    validatorUrl: null,
    docExpansion: "none",  // the sections folded: a reader opens the one they need
    defaultModelsExpandDepth: 0,  // the schemas listed, folded: Problem's `code` lists every error code
    presets: [SwaggerUIBundle.presets.apis],
    onComplete: () => {{
      // Swagger UI leaves its server picker without a name.
      for (const select of document.querySelectorAll("#swagger-container select:not([aria-label])")) {{
        select.setAttribute("aria-label", select.closest(".servers") ? "Server" : "Choice");
      }}
    }},
  }});
</script>
</body>
</html>
""".encode()

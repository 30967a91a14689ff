"""The API reference page (`/api/schema/swagger`, also `/api/schema`): Swagger UI, whose files come
from the `swagger-ui-bundle-v2` package and are served by this instance under
`/static/api-reference/`. Litestar's own UI plugins load their scripts, styles and favicon from
CDNs; this one names only local files, reads the completed contract (`/api/schema/openapi.json`,
see `forge.api_contract`), and turns off Swagger UI's online validator, so the page never makes
a request that leaves the instance."""

import html
from pathlib import Path
from typing import Any

import swagger_ui_bundle
from litestar import Request, get
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.params import FromPath
from litestar.response import File

from forge.error_codes import Code
from forge.errors import NotFound

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
    defaultModelsExpandDepth: -1,
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

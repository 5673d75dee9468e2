"""Static files, public (no key): the docs page (Swagger UI, whose two assets come from the
aws-lambda-powertools package, so it works offline) and the tenant console (the files of
functions/api/console/, packaged with the function: no CDN, no build step). The console's key is
typed into the page and sent by its script as x-api-key."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi import swagger_ui
from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

DOCS_PATH = "/v1/docs"
DOCS_ASSETS = {  # Swagger UI, as the aws-lambda-powertools package ships it (offline)
    "/v1/docs/swagger-ui-bundle.js": ("swagger-ui-bundle.min.js", "application/javascript"),
    "/v1/docs/swagger-ui.css": ("swagger-ui.min.css", "text/css"),
}
CONSOLE_MODULES = (  # the console's script: ES modules, main.js imports the others
    "main.js", "router.js", "session.js", "api.js", "state.js", "dom.js", "format.js",
    "timers-list.js", "groups.js", "timer-form.js", "timer-page.js", "fire-history.js",
    "failed-fires.js", "keys.js", "usage.js",
)  # fmt: skip
CONSOLE_FILES = {  # the tenant console: static files of functions/api/console/
    "/v1/console": ("index.html", "text/html; charset=utf-8"),
    "/v1/console/console.css": ("console.css", "text/css; charset=utf-8"),
    # A module's type must be JavaScript (the browser refuses any other, nosniff or not).
    **{f"/v1/console/{name}": (name, "text/javascript; charset=utf-8") for name in CONSOLE_MODULES},
}
STATIC_PATHS = frozenset({DOCS_PATH, *DOCS_ASSETS, *CONSOLE_FILES})
SWAGGER_UI_DIR = Path(swagger_ui.__file__).parent
CONSOLE_DIR = Path(__file__).parent.parent / "console"
# The page runs only its own scripts (its modules, from this origin) and style and talks only to
# this API: an injected <script> or inline handler cannot run, so a key in sessionStorage is not
# an XSS away.
CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
CONSOLE_HEADERS = {
    "Content-Security-Policy": CONSOLE_CSP,
    # Revalidate every time: the files are not versioned by name, and a page of one deploy
    # with the modules of another would break.
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
DOCS_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Timer service API</title>
  <link rel="icon" href="data:,">
  <link rel="stylesheet" href="docs/swagger-ui.css">
</head>
<body>
  <p><a href="console">Tenant console</a>: sign in with an API key to see, create and manage
     timers in the browser.</p>
  <div id="swagger-ui">Loading...</div>
  <script src="docs/swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({
      url: "openapi.json",
      dom_id: "#swagger-ui",
      deepLinking: true,
      docExpansion: "list",
      layout: "BaseLayout",
      presets: [SwaggerUIBundle.presets.apis],
      validatorUrl: null,  // no badge from validator.swagger.io: the page works offline
    });
  </script>
</body>
</html>
"""
router = APIGatewayHttpRouter()  # not operations of the OpenAPI document


@router.get(DOCS_PATH, include_in_schema=False)
def docs_page() -> Response[str]:
    return Response(status_code=200, content_type="text/html; charset=utf-8", body=DOCS_HTML,
                    headers={"Cache-Control": "no-cache"})  # fmt: skip


def _file_route(
    path: str, directory: Path, filename: str, media: str, headers: Mapping[str, str]
) -> None:
    """``GET path``: a static file shipped with the function, public (no key), compressed."""

    @router.get(path, include_in_schema=False, compress=True)
    def serve() -> Response[str]:
        return Response(status_code=200, content_type=media, body=_file(directory, filename),
                        headers=dict(headers))  # fmt: skip


@cache
def _file(directory: Path, filename: str) -> str:
    return (directory / filename).read_text(encoding="utf-8")


DOCS_ASSET_HEADERS = {"Cache-Control": "public, max-age=86400"}  # Swagger UI changes per release
for _path, (_filename, _media) in DOCS_ASSETS.items():
    _file_route(_path, SWAGGER_UI_DIR, _filename, _media, DOCS_ASSET_HEADERS)
for _path, (_filename, _media) in CONSOLE_FILES.items():
    _file_route(_path, CONSOLE_DIR, _filename, _media, CONSOLE_HEADERS)

"""The tenant console's files (``GET /v1/console``, its style and its script's ES modules): served
by the api function with no key, under a Content-Security-Policy that lets the page run only its
own modules, and linked from the docs page."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest

from functions.api import app as api_app
from functions.api.app import openapi, static_files
from ops import template
from ops.local.apigw import HttpResponse, from_proxy_result
from ops.local.context import LambdaContext
from tests.integration.api_harness import Api, make_api
from tests.support import apigw
from tests.support.clock import FakeClock

MODULES = sorted(static_files.CONSOLE_DIR.glob("*.js"))
FILES = {
    "/v1/console": "text/html",
    "/v1/console/console.css": "text/css",
    # a module of another type would not run: browsers check a module script's type
    **{f"/v1/console/{module.name}": "text/javascript" for module in MODULES},
}
MODULE_MAX_LINES = 400  # one idea each
_IMPORT = re.compile(r"""^import\b[^;]*?["']([^"']+)["'];""", re.MULTILINE | re.DOTALL)


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    yield make_api(monkeypatch, clock, redis_url)


def get(path: str, headers: dict[str, str] | None = None) -> HttpResponse:
    """The api function's answer as API Gateway gives it to the browser (bodies are not JSON)."""
    event = apigw.event("GET", path, headers=headers or {}, content_type=None)
    result = api_app.handler(event, LambdaContext(function_name="api"))
    response = from_proxy_result(json.dumps(result).encode())
    assert response is not None, result
    return response


@pytest.mark.parametrize("path", FILES)
def test_each_file_is_served_without_a_key_under_a_strict_policy(api: Api, path: str) -> None:
    response = get(path)
    headers = {name.lower(): value for name, value in response.headers}
    assert response.status == 200
    assert headers["content-type"].split(";")[0] == FILES[path]
    policy = dict(
        part.strip().split(" ", 1) for part in headers["content-security-policy"].split(";")
    )
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'"  # no 'unsafe-inline', no other origin
    assert policy["frame-ancestors"] == "'none'"
    assert headers["cache-control"] == "no-cache"
    assert headers["x-content-type-options"] == "nosniff"
    filename, _ = static_files.CONSOLE_FILES[path]
    assert response.body == (static_files.CONSOLE_DIR / filename).read_bytes()


def test_the_page_loads_only_its_own_files_and_has_no_inline_script(api: Api) -> None:
    page = get("/v1/console").body.decode()
    assert '<script type="module" src="console/main.js"></script>' in page
    assert page.count("<script") == 1  # main.js imports the other modules
    assert '<link rel="stylesheet" href="console/console.css">' in page
    assert "<script>" not in page and "style=" not in page
    assert not re.search(r"\son\w+=", page)  # no inline event handler: the CSP would block it
    assert "http://" not in page and "https://" not in page  # nothing from elsewhere


def _imports(module: str) -> list[str]:
    return _IMPORT.findall((static_files.CONSOLE_DIR / module).read_text(encoding="utf-8"))


def test_the_modules_import_only_served_modules_and_main_reaches_them_all() -> None:
    """A module imports its siblings by relative path (resolved next to it, under
    /v1/console/), each one served; from main.js every module is reached, none left over; the
    imports form no cycle (where one would close, main.js hands a callback over instead); each
    module stays short."""
    served = {name for name, _ in static_files.CONSOLE_FILES.values() if name.endswith(".js")}
    assert served == {module.name for module in MODULES}
    reached: list[str] = []  # depth first, each module after what it imports

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"an import cycle: {' -> '.join((*path, module))}"
        if module in reached:
            return
        for specifier in _imports(module):
            assert specifier.startswith("./") and specifier.count("/") == 1, (module, specifier)
            assert specifier[2:] in served, (module, specifier)
            visit(specifier[2:], (*path, module))
        reached.append(module)

    visit("main.js", ())
    assert set(reached) == served
    for module in MODULES:
        lines = len(module.read_text(encoding="utf-8").splitlines())
        assert lines <= MODULE_MAX_LINES, (module.name, lines)


class _Page(HTMLParser):
    """The page's labels, form controls, buttons (with their text) and ids, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.labelled: set[str] = set()
        self.controls: list[str] = []
        self.buttons: list[tuple[dict[str, str | None], str]] = []
        self.ids: list[str] = []
        self._button: dict[str, str | None] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.append(found["id"] or "")
        if tag == "label" and found.get("for"):
            self.labelled.add(found["for"] or "")
        elif tag in ("input", "select", "textarea"):
            self.controls.append(found.get("id") or repr(found))
        elif tag == "button":
            self._button, self._text = found, ""

    def handle_data(self, data: str) -> None:
        self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "button" and self._button is not None:
            self.buttons.append((self._button, self._text.strip()))
            self._button = None


def _page() -> _Page:
    page = _Page()
    page.feed((static_files.CONSOLE_DIR / "index.html").read_text(encoding="utf-8"))
    return page


def test_every_control_has_a_label_and_every_button_text() -> None:
    """Accessibility basics: each input, select and textarea is named by a <label for>, each
    button by its own text (the browser test checks the buttons the script adds)."""
    page = _page()
    assert page.controls and [c for c in page.controls if c not in page.labelled] == []
    assert page.buttons and [attrs for attrs, text in page.buttons if not text] == []


def test_the_list_page_puts_create_first_then_the_timers_then_the_failed_fires() -> None:
    ids = _page().ids
    order = ["list-view", "create-card", "create-form", "timers-card", "failed-panel"]
    assert [ids.index(name) for name in order] == sorted(ids.index(name) for name in order)


def test_a_wrong_key_or_method_changes_nothing(api: Api) -> None:
    assert api.call("GET", "/v1/tenant", tenant=None).status == 401  # unlike the console's files
    assert get("/v1/console", {"x-api-key": "tk_not-a-key"}).status == 200  # the key is ignored
    event = apigw.event("POST", "/v1/console", body={}, headers={})
    result = api_app.handler(event, LambdaContext(function_name="api"))
    assert (result["statusCode"], result["headers"]["Allow"]) == (405, "GET")


def test_the_docs_page_links_the_console(api: Api) -> None:
    assert '<a href="console">' in get("/v1/docs").body.decode()


def test_the_console_is_no_operation_of_the_document(api: Api) -> None:
    """Files for people, not API operations: the docs page would list them among them."""
    paths = json.loads(openapi.openapi_document())["paths"]
    assert not any(path.startswith(("/v1/console", "/v1/docs")) for path in paths)


def test_the_files_ship_with_the_function() -> None:
    # sam build packages the function's CodeUri directory: the console must be inside it.
    code_uri = template.resources("AWS::Serverless::Function")["ApiFunction"]["CodeUri"]
    assert static_files.CONSOLE_DIR.is_relative_to(template.ROOT / code_uri)
    assert {name for name, _ in static_files.CONSOLE_FILES.values()} == {
        path.name for path in static_files.CONSOLE_DIR.iterdir()
    }

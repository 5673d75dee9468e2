"""schemathesis hooks for ``tests/e2e/test_fuzz.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

After every call, a timer the fuzzer created is deleted (its answer, already received, is
checked as it came), so the stack is not left firing a fuzzer's ``every 1 s`` timers while
the rest of the suite runs on it; an API key it made is revoked (a tenant keeps 10 at most).
(``after_validate`` is not called in every phase.)
"""

from __future__ import annotations

import os
from typing import Any

import requests
import schemathesis

_http = requests.Session()


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    if response.status_code != 201:
        return
    api, key = os.environ["FUZZ_API"], os.environ["FUZZ_API_KEY"]
    body = response.json()
    # A repeated Idempotency-Key answers the first response again: its timers may be gone
    # already (this hook deleted them after that first call).
    replay = any(k.lower() == "idempotency-key" for k in response.request.headers)
    if "api_key" in body:  # a key it made (POST /v1/tenant/keys): revoked again at once
        gone = _http.delete(f"{api}/tenant/keys/{body['key_id']}", headers={"x-api-key": key},
                            timeout=30)  # fmt: skip
        assert gone.status_code == 204, gone.text
        return
    for timer in body.get("items", [body]):
        gone = _http.delete(f"{api}/timers/{timer['id']}", headers={"x-api-key": key}, timeout=30)
        assert gone.status_code == 204 or (replay and gone.status_code == 404), gone.text

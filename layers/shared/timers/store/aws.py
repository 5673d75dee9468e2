"""AWS clients whose service data is read once per process (cold starts).

Every botocore session parses its own copy of the service models and endpoint data (JSON files
of hundreds of KB) when it builds its first client; pynamodb builds a session per model class
(each bound model has its own connection), so the api's first request built five or six and
spent ~0.3 s of CPU parsing the same files again. Here every session shares one data loader:
each file is parsed once per process. Clients are plain botocore clients - what ``boto3.client``
returns - configured the same way (region, credentials and ``AWS_ENDPOINT_URL*`` from the
environment when the client is built); boto3 itself (and s3transfer with it) is not imported.
"""

from __future__ import annotations

import threading
from typing import Any

import botocore.session
from botocore.config import Config

_lock = threading.Lock()
_loader: list[Any] = []  # the process's data loader, once a session has made it


def session() -> botocore.session.Session:
    """A new botocore session (it reads the environment as it stands) sharing the process's
    parsed service data."""
    fresh = botocore.session.Session()
    with _lock:
        if _loader:
            fresh.register_component("data_loader", _loader[0])
        else:
            _loader.append(fresh.get_component("data_loader"))
    return fresh


def client(service: str, config: Config | None = None) -> Any:
    """``boto3.client(service, config=config)``, on a session sharing the parsed data."""
    return session().create_client(service, config=config)


def share_with_pynamodb() -> None:
    """pynamodb's connections make their sessions with this module's (one per connection and
    thread, as before: only the parsed data is shared)."""
    import pynamodb.connection.base

    pynamodb.connection.base.get_session = session  # type: ignore[assignment]

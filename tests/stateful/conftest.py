"""The stateful test runs on the integration suite's real redis-server."""

from tests.integration.conftest import redis_url  # noqa: F401

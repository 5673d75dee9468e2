"""The timer service's shared code (the functions' layer), in floors by capability. A module
may import its own package or a lower floor, never a higher one, and no two packages import
each other (tests/unit/test_architecture.py holds the code to it):

1. ``core``: the pure rules (no I/O);
2. ``store``: what every capability shares: DynamoDB access, the timers table, AWS clients;
3. ``tenancy``: tenants, their API keys, usage and rate limits;
4. ``engine``: the fire path;
5. ``delivery``: webhook delivery (the delivery function's work, its tables);
6. ``api``: the HTTP API's use cases and models;
7. this package itself: ``config`` and ``runtime`` (the wiring), ``deferred_imports``.
"""

from timers import deferred_imports

deferred_imports.install()  # before anything imports redis: its asyncio client loads on use

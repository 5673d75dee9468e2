"""The timer service's shared code (the functions' layer)."""

from timers import deferred_imports

deferred_imports.install()  # before anything imports redis: its asyncio client loads on use

"""The HTTP API's use cases and models: timers (``service``, ``creating``, ``cursors``,
``views``, ``idempotency``), groups (``groups``, ``groups_table``), failed fires
(``failures``), and the request and response models (``request_models``,
``response_models``).

May import: ``core``, ``store``, ``tenancy``, ``engine``, ``delivery``."""

"""Webhook delivery: the delivery function's work (``messages``, ``decisions`` for one message,
``batches``), the POST (``http_target``), the per-target slots (``target_slots``), each fire's
delivery record (``records``) and the failed fires table (``failed_fires``).

May import: ``core``, ``store``, ``tenancy``, ``engine``."""

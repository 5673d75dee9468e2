"""The fire path: how a timer is found, put in Redis, dispatched, claimed, sent, recorded and
chained, and how a change wins over a fire on its way (its data model and proof: docs/fire-path.md).

- ``entries``: the pure rules; ``log``, ``wake``, ``index`` (scripts in ``lua/``), ``keys``: the
  fire log and the wake listings in DynamoDB, the buckets in Redis, every Redis key name;
- ``changes``, ``extra``: what the api asks (store, derive, change; run now); ``migrate``,
  ``fanout``: those functions' cores; the trigger's: ``trigger`` (the run), ``claim``, ``send``
  (the reference clock they keep is ``timers.core.clock``); ``callbacks``: the callback message
  and its SQS batches.

Floors, bottom to top: core < store < tenancy < engine < delivery < api < config, runtime and
functions. The engine imports only core, store, tenancy and itself.
"""

"""The fire path: how a timer is found, put in Redis, dispatched, claimed, sent, recorded and
chained, and how a change wins over a fire on its way. Its data model and its proof are in
docs/fire-path.md.

- ``entries``: the pure rules (claims, steps, walks); ``log``, ``wake``, ``index``: the fire
  log and the wake listings in DynamoDB, the buckets in Redis (scripts in ``lua/``);
  ``keys``: every Redis key name;
- ``changes``: what the api asks (store, derive, change); ``migrate``, ``fanout``, ``trigger``:
  the three scheduled functions' cores.
"""

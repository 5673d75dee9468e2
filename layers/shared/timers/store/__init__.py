"""What every capability shares: DynamoDB access (``dynamodb``: bound models, the low-level
client, condition failures), the timers table (``timers_table``: the source of truth, used by
the engine, the api and delivery) and the process's AWS clients (``aws``).

May import: ``core``."""

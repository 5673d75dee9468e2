"""Tenants and what they are allowed: the tenants table (``table``), tenants and their
webhook secrets (``tenants``), their API keys (``keys``) and the api's memory of them
(``auth``), usage counters (``usage``) and the API rate limit (``ratelimit``).

May import: ``core``, ``store``."""

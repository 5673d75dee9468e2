"""The API's operations, one router per resource; the handler module includes them in this
order (the OpenAPI document lists operations in the order they were added)."""

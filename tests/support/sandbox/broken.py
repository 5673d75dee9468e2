"""A handler module that cannot be imported: the init error the stack must report."""

import module_that_does_not_exist  # noqa: F401


def handler(event: object, context: object) -> None:
    return None

"""Keep a process that uses moto from ever reaching a real AWS account."""

from __future__ import annotations

import os

LOCAL_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
"""What botocore insists on and moto ignores: the local stack and its clients use these."""

_REAL_AWS = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS")


def use_fake_aws() -> None:
    """Drop whatever the shell points at AWS and set fake credentials (moto accepts any)."""
    for name in _REAL_AWS:
        os.environ.pop(name, None)
    os.environ.update(
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_SESSION_TOKEN="testing",
        POWERTOOLS_METRICS_NAMESPACE="Timers",
        POWERTOOLS_SERVICE_NAME="timers",
        POWERTOOLS_TRACE_DISABLED="true",
    )

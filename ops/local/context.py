"""A Lambda context object as the runtime passes one to a handler."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field


@dataclass
class LambdaContext:
    function_name: str = "test-function"
    memory_limit_in_mb: int = 512
    function_version: str = "$LATEST"
    timeout_s: float = 30.0
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_group_name: str = "/aws/lambda/test-function"
    log_stream_name: str = "stream"
    _started: float = field(default_factory=time.monotonic)

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_s - (time.monotonic() - self._started)) * 1000))

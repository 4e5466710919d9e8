"""The demo (`aiops demo`, `make demo`): a real incident on the embedded stack, end to end.

``trace`` holds the one-request telemetry walk the stack tests share."""

from aiops_harness.demo.trace import MODEL, QUESTIONS, chat, new_traceparent, wait_for_trace

__all__ = ["MODEL", "QUESTIONS", "chat", "new_traceparent", "wait_for_trace"]

"""Model hosting on Ray Serve: backends, the OpenAI-compatible ingress, instrumentation."""

"""Serving aiops did not start: Ray clusters and vLLM servers it observes and acts on."""

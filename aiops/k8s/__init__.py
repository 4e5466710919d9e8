"""Kubernetes deployment: manifests rendered from the model specs (``render``) and checked
against what the design asks of every workload (``lint``)."""

"""Kubernetes deployment: manifests rendered from the model specs (``render``) and checked
against what every workload must have (``lint``)."""

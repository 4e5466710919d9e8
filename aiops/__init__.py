"""aiops: observability and AIOps for AI model serving."""

__version__ = "0.1.0"

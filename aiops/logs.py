"""Process-level logging setup for aiops services: JSON lines on stderr.

Only entry points (``aiops server``, the Serve driver) call this; library modules just use
``logging.getLogger(__name__)``.
"""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

__all__ = ["configure_json_logging"]


def configure_json_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)

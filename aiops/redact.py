"""The configuration as it may be shown: `aiops config show`, and anything else that prints or
logs settings, shows secrets only as set or not, and no credentials inside URLs."""

from __future__ import annotations

import json
import re
from typing import Any

from aiops.config import Settings

__all__ = ["REDACTED", "SECRET_SETTINGS", "redact_url_secrets", "redacted_settings"]

# Settings whose values are secrets: `aiops config show` (and anything else that prints or
# logs the configuration) shows only whether they are set. A test checks that every setting
# named like a token, key, secret or password is here or is known not to be one.
SECRET_SETTINGS: frozenset[str] = frozenset({
    "admin_token", "api_keys", "token", "agent_llm_api_key", "slack_signing_secret"})

REDACTED = "***"
# A URL's ``scheme://userinfo@``: a password (``user:pass@``) or a bare token (``token@``).
# Up to the authority's last ``@``: a password with a raw ``@`` in it (``user:p@ss@host``,
# which clients accept) is all of it hidden, not only up to its first ``@``.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
# ``password=...`` in a libpq key/value connection string (``lake_catalog``: ``host=db
# password=s3cret``), quoted or not.
_KEYWORD_SECRET = re.compile(r"(?P<lead>\b(?:password|sslpassword|passwd|pwd)\s*=\s*)"
                             r"(?P<value>'(?:[^'\\]|\\.)*'|[^\s']\S*)", re.IGNORECASE)
# ``name=value`` in a URL's query or fragment whose name says it is a secret.
_SECRET_PARAM = re.compile(
    r"(?P<lead>[?&;#](?:[^=&;#\s,]*?)(?:token|key|secret|passw|pwd|auth|signature|sig|"
    r"credential|session|code)[^=&;#\s,]*=)(?P<value>[^&;#\s,]+)", re.IGNORECASE)


def redact_url_secrets(text: str) -> str:
    """``text`` with the credentials inside any URL in it replaced by ``***``: the password
    of ``user:password@host`` (a bare ``token@host`` entirely) and the value of a query or
    fragment parameter named like a secret (``?token=``, ``api_key=``, ``X-Amz-Signature=``);
    and the ``password=`` of a key/value connection string."""
    text = _KEYWORD_SECRET.sub(lambda m: f"{m.group('lead')}{REDACTED}", text)
    if "://" not in text:
        return text

    def userinfo(m: re.Match[str]) -> str:
        user, colon, _ = m.group("userinfo").partition(":")
        if not colon:
            return f"{m.group('scheme')}{REDACTED}@"
        return f"{m.group('scheme')}{user}:{REDACTED}@"

    return _SECRET_PARAM.sub(lambda m: f"{m.group('lead')}{REDACTED}",
                             _URL_USERINFO.sub(userinfo, text))


def redacted_settings(settings: Settings) -> dict[str, Any]:
    """The settings as JSON-ready values, safe to print or log: each of ``SECRET_SETTINGS``
    shows only whether it is set, and credentials inside URLs in any other string (nested in
    lists and tables too, e.g. ``attach``) are replaced by ``***``."""
    shown: dict[str, Any] = json.loads(settings.model_dump_json())
    for name in SECRET_SETTINGS & shown.keys():
        if shown[name]:
            shown[name] = f"{REDACTED} (set, redacted)"
    return {name: _redact(value) for name, value in shown.items()}


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return redact_url_secrets(value)
    if isinstance(value, list):
        return [_redact(v) for v in value]
    if isinstance(value, dict):
        return {k: _redact(v) for k, v in value.items()}
    return value

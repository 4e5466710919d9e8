"""`aiops config show` prints no credential, also not one inside a URL (issue P11, item 11):
``user:password@`` in any URL, a bare ``token@``, and query parameters named like secrets."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aiops.cli import app

SECRETS = ["llm-pass-0123456789", "llm-key-0123456789", "scrape-pass-0123456789",
           "scrape-token-0123456789", "ray-pass-0123456789", "vllm-key-0123456789",
           "bare-token-0123456789"]

ENV = {
    "AIOPS_AGENT_LLM_URL": "https://agent:llm-pass-0123456789@llm.example:8443/v1"
                           "?api_key=llm-key-0123456789&region=eu",
    "AIOPS_SCRAPE_TARGETS": "ray=http://prom:scrape-pass-0123456789@head:8080/metrics,"
                            "vllm=http://vllm:8000/metrics?token=scrape-token-0123456789",
    "AIOPS_ATTACH": json.dumps([
        {"kind": "ray", "name": "prod", "url": "http://admin:ray-pass-0123456789@head:8265"},
        {"kind": "vllm", "name": "v", "url": "http://bare-token-0123456789@vllm:8000",
         "metrics_url": "http://vllm:8000/metrics?access_token=vllm-key-0123456789"}]),
}


def test_config_show_redacts_credentials_inside_urls() -> None:
    result = CliRunner().invoke(app, ["config", "show"], env=ENV)
    assert result.exit_code == 0, result.output
    for secret in SECRETS:
        assert secret not in result.output
    shown = json.loads(result.output)
    # What is not a credential stays readable: hosts, users, other parameters.
    assert shown["agent_llm_url"] == "https://agent:***@llm.example:8443/v1?api_key=***&region=eu"
    assert shown["scrape_targets"] == ("ray=http://prom:***@head:8080/metrics,"
                                       "vllm=http://vllm:8000/metrics?token=***")
    assert shown["attach"][0]["url"] == "http://admin:***@head:8265"
    assert shown["attach"][1]["url"] == "http://***@vllm:8000"
    assert shown["attach"][1]["metrics_url"] == "http://vllm:8000/metrics?access_token=***"


@pytest.mark.parametrize(("text", "shown"), [
    ("postgres://u:p4ss@db:5432/x?sslmode=require", "postgres://u:***@db:5432/x?sslmode=require"),
    ("https://h/o?X-Amz-Signature=abc&X-Amz-Credential=k&x=1",
     "https://h/o?X-Amz-Signature=***&X-Amz-Credential=***&x=1"),
    ("https://h/cb#access_token=abc", "https://h/cb#access_token=***"),
    ("http://host:8000/a@b", "http://host:8000/a@b"),
    ("no url here, token=abc", "no url here, token=abc"),
    # A raw '@' in a password (clients accept it): all of the password hidden.
    ("postgres://u:p@ss@db/x", "postgres://u:***@db/x"),
    # lake_catalog is a libpq key/value string, not a URL.
    ("host=pg dbname=lake user=aiops password=s3cret", "host=pg dbname=lake user=aiops "
     "password=***"),
    ("host=pg password='with space' user=aiops", "host=pg password=*** user=aiops"),
])
def test_url_credentials_are_found_wherever_they_are(text: str, shown: str) -> None:
    from aiops.redact import redact_url_secrets

    assert redact_url_secrets(text) == shown

"""Client SDKs (P16): a model's OpenAPI document (serve/openapi.py) and the typed package
`aiops sdk generate` makes from it. The first tests build documents offline from specs; the
`stack` ones run a stack of their own (echo + MiniLM, behind an API key), install generated
clients with pip and call it with them, then change a model's input_schema through the
control plane and watch the generated types change."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from referencing import Registry, Resource
from typer.testing import CliRunner

from aiops.cli import app as cli_app
from aiops.config import Settings
from aiops.lifecycle import LifecycleClient
from aiops.sdk import SdkError, generate_package
from aiops.stack import read_state, session_members, settings_env
from aiops_harness.bench.common import free_port
from serve.openapi import document, document_bytes
from serve.specs import ModelSpec, load_specs
from tests.conftest import running_stack

MODELS = Path(__file__).resolve().parents[1] / "models-lifecycle.yaml"
API_KEY = "sdk-test-key-0123456789abcdef"
EMBED = "minilm-l6-v2"


def spec(**kw: Any) -> ModelSpec:
    base: dict[str, Any] = {"name": "echo", "version": "v1", "backend": "echo",
                            "model_type": "llm"}
    return ModelSpec.model_validate({**base, **kw})


def validator(doc: dict[str, Any], component: str) -> jsonschema.Draft202012Validator:
    """A validator of one component of the document, its references resolved in it."""
    resource = Resource.from_contents({**doc, "$schema": "https://json-schema.org/draft/"
                                       "2020-12/schema"})
    registry: Registry[Any] = Registry().with_resource("urn:doc", resource)
    return jsonschema.Draft202012Validator(
        {"$ref": f"urn:doc#/components/schemas/{component}"}, registry=registry)


def cli(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli_app, args, env=env)


def said(result: Any) -> str:
    """What a command printed, with rich's line wrapping undone."""
    return " ".join(result.output.split())


def install(project: Path, target: Path) -> None:
    """pip-install a generated package into ``target`` (offline: its dependencies are this
    environment's)."""
    run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-index", "--no-build-isolation", "--target", str(target),
                          str(project)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


@pytest.fixture
def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Generate, install and import a package from a document (each under its own name)."""
    loaded: list[str] = []

    def _load(args: list[str], package: str, env: dict[str, str] | None = None) -> ModuleType:
        out = tmp_path / package
        result = cli(["sdk", "generate", *args, "--out", str(out), "--package", package], env)
        assert result.exit_code == 0, result.output
        target = tmp_path / f"site-{package}"
        install(out, target)
        monkeypatch.syspath_prepend(str(target))
        loaded.append(package)
        return importlib.import_module(package)

    yield _load
    for name in [m for m in sys.modules if m.split(".")[0] in loaded]:
        del sys.modules[name]


# -- the document -------------------------------------------------------------------------

def test_the_same_spec_gives_the_same_bytes_and_its_digest() -> None:
    a = spec(input_schema={"type": "object", "properties": {"a": {"type": "string"},
                                                            "b": {"type": "integer"}}})
    b = spec(input_schema={"properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                           "type": "object"})
    assert document_bytes(a) == document_bytes(b)
    assert json.loads(document_bytes(a)) == document(a)
    doc = document(a)
    digest = doc["info"].pop("x-aiops-digest")
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert digest == "sha256:" + hashlib.sha256(canonical).hexdigest()
    # The interface, not the deployment: weights, QoS and replicas leave it as it is...
    moved = spec(input_schema=a.input_schema, qos={"timeout_s": 5}, max_ongoing_requests=9)
    assert document_bytes(moved) == document_bytes(a)
    # ...a schema or a version does not.
    assert document(spec(input_schema={"type": "object"}))["info"]["x-aiops-digest"] != \
        json.loads(document_bytes(a))["info"]["x-aiops-digest"]
    assert document(spec(version="v2"))["info"]["version"] == "v2"


@pytest.mark.parametrize(("model_type", "modalities", "paths"), [
    ("llm", ["text"], ["/v1/chat/completions", "/v1/completions"]),
    ("embedding", ["text"], ["/v1/embeddings"]),
    ("vision", ["image"], ["/v1/chat/completions"]),
])
def test_a_model_gets_the_operations_of_its_type(model_type: str, modalities: list[str],
                                                 paths: list[str]) -> None:
    doc = document(spec(model_type=model_type, modalities=modalities))
    assert sorted(doc["paths"]) == paths
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["x-aiops-model"]["model_type"] == model_type
    for item in doc["paths"].values():
        op = item["post"]
        request = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        component = doc["components"]["schemas"][request.rsplit("/", 1)[1]]
        assert component["properties"]["model"]["const"] == "echo"
        assert "model" in component["required"]
        assert {"200", "400", "401", "404", "429"} <= set(op["responses"])
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_the_input_schema_is_intersected_with_the_openai_request() -> None:
    doc = document(spec(input_schema={
        "type": "object", "required": ["tenant"],
        "properties": {"max_tokens": {"type": "integer", "maximum": 1024},
                       "tenant": {"$ref": "#/$defs/Tenant"},
                       "stream": {"type": "string"}},
        "$defs": {"Tenant": {"type": "string", "pattern": "^[a-z]+$"}}}))
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    # Both the ingress' own limit (>= 1) and the model's (<= 1024) hold.
    assert chat["properties"]["max_tokens"]["minimum"] == 1
    assert chat["properties"]["max_tokens"]["maximum"] == 1024
    assert chat["required"] == ["model", "messages", "tenant"]
    # The model's $defs move into the components, references along.
    assert chat["properties"]["tenant"] == {"$ref": "#/components/schemas/InputTenant"}
    assert doc["components"]["schemas"]["InputTenant"]["pattern"] == "^[a-z]+$"
    # A keyword given differently by both stays a conjunction: no body satisfies it.
    assert chat["properties"]["stream"]["allOf"] == [{"type": "string"}]
    ok = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "tenant": "acme"}
    check = validator(doc, "ChatCompletionRequest")
    assert check.is_valid(ok)
    for bad in ({**ok, "max_tokens": 5000}, {**ok, "max_tokens": 0}, {**ok, "model": "other"},
                {**ok, "tenant": "ACME"}, {k: v for k, v in ok.items() if k != "tenant"}):
        assert not check.is_valid(bad), bad


def test_the_output_schema_reaches_the_response_fields() -> None:
    doc = document(spec(output_schema={"type": "object", "properties": {
        "text": {"type": "string", "maxLength": 500},
        "finish_reason": {"enum": ["stop", "length"]}}}))
    schemas = doc["components"]["schemas"]
    assert schemas["ChatMessage"]["properties"]["content"]["maxLength"] == 500
    assert schemas["CompletionChoice"]["properties"]["text"]["maxLength"] == 500
    assert schemas["ChatChoice"]["properties"]["finish_reason"]["enum"] == ["stop", "length"]
    assert schemas["ChatCompletion"]["properties"]["model"]["const"] == "echo"


# -- generation from a spec file ----------------------------------------------------------

def spec_file(tmp: Path, name: str, **echo: Any) -> Path:
    doc = yaml.safe_load(MODELS.read_text())
    doc["models"][0].update(echo)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_schema_change_shows_up_as_a_type_change(tmp_path: Path, load: Any) -> None:
    before = load(["echo", "--spec", str(spec_file(tmp_path, "a"))], "sdk_before")
    tenant: dict[str, Any] = {"type": "object", "required": ["tenant"], "properties": {
        "tenant": {"type": "string"}, "max_tokens": {"type": "integer", "maximum": 64}}}
    added = load(["echo", "--spec", str(spec_file(tmp_path, "b", input_schema=tenant))],
                 "sdk_added")
    tenant["properties"]["tenant"] = {"type": "integer"}
    changed = load(["echo", "--spec", str(spec_file(tmp_path, "c", input_schema=tenant))],
                   "sdk_changed")

    def field(module: ModuleType, name: str) -> Any:
        return module.models.ChatCompletionRequest.model_fields.get(name)

    assert field(before, "tenant") is None
    assert field(added, "tenant").annotation is str and field(added, "tenant").is_required()
    assert field(changed, "tenant").annotation is int
    assert before.DIGEST != added.DIGEST != changed.DIGEST
    assert field(before, "model").annotation == field(added, "model").annotation
    # The models validate as the server does: the model's maximum, its name as a Literal.
    req = added.models.ChatCompletionRequest
    msg = [{"role": "user", "content": "hi"}]
    assert req(model="echo", messages=msg, tenant="t").max_tokens == 128
    with pytest.raises(ValueError, match="max_tokens"):
        req(model="echo", messages=msg, tenant="t", max_tokens=65)
    with pytest.raises(ValueError, match="model"):
        req(model="other", messages=msg, tenant="t")
    # And a type checker sees the change: a call written for the previous schema is refused.
    use = tmp_path / "use.py"
    use.write_text(
        "from sdk_changed.models import ChatCompletionRequest, Message\n"
        "ChatCompletionRequest(model='echo', tenant='acme',\n"
        "                      messages=[Message(role='user', content='hi')])\n")
    # Outside the repository (not its mypy config), without the pydantic plugin: the models'
    # constructors are typed as pydantic declares them.
    refused = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / ".mypy"),
         str(use)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "MYPYPATH": str(tmp_path / "site-sdk_changed")})
    assert refused.returncode == 1, refused.stdout
    assert refused.stdout.count("error:") == 1, refused.stdout
    assert 'Argument "tenant" to "ChatCompletionRequest" has incompatible type "str"; ' \
        'expected "int"' in refused.stdout


def test_the_cli_says_why_it_cannot_generate(tmp_path: Path) -> None:
    models = str(spec_file(tmp_path, "m"))
    result = cli(["sdk", "generate", "nope", "--spec", models, "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "has no model 'nope'" in said(result)
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = cli(["sdk", "generate", "echo", "--url", nowhere, "--out", str(tmp_path / "x")])
    assert result.exit_code == 1
    assert "cannot reach the Serve endpoint" in said(result)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    result = cli(["sdk", "generate", "echo", "--spec", models, "--out", str(mine)])
    assert result.exit_code == 1 and "--force" in said(result)
    assert (mine / "notes.txt").read_text() == "keep"
    assert not (tmp_path / "x").exists()


def test_a_document_that_would_put_code_in_the_package_is_refused(tmp_path: Path) -> None:
    doc = document(spec())
    doc["info"]["x-aiops-model"]["name"] = 'x"""\nimport os  #'
    with pytest.raises(SdkError, match="not an aiops model document"):
        generate_package(json.dumps(doc).encode(), tmp_path / "p")
    doc = document(spec())
    doc["paths"]["/v1/completions"]["post"]["summary"] = 'ok."""\nimport os  #'
    with pytest.raises(SdkError, match="unexpected path or summary"):
        generate_package(json.dumps(doc).encode(), tmp_path / "p")
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


def test_openapi_prints_the_offline_document(tmp_path: Path) -> None:
    models = spec_file(tmp_path, "m")
    result = cli(["sdk", "openapi", EMBED, "--spec", str(models)])
    assert result.exit_code == 0, result.output
    [embed] = [s for s in load_specs(models) if s.name == EMBED]
    assert result.stdout.strip().encode() == document_bytes(embed)


# -- the running stack ---------------------------------------------------------------------

# This stack runs Ray Serve's high-throughput mode (HAProxy in front; serve.throughput), so
# the same checks of the served documents and the generated client cover that front too.
@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    with running_stack(tmp_path_factory.mktemp("sdk"), MODELS, api_keys=API_KEY,
                       serve_proxy="haproxy") as s:
        yield s


@pytest.mark.stack
def test_haproxy_takes_http_in_front_of_this_stack(stack: Settings) -> None:
    [serve_pid] = [c.pid for c in read_state(stack) if c.name == "serve"]
    fronts = [pid for pid in session_members(serve_pid)
              if b"haproxy" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert fronts, "no HAProxy process in the Serve driver's session"
    r = httpx.post(f"{stack.serve_url}/v1/embeddings", timeout=30,
                   headers={"authorization": f"Bearer {API_KEY}",
                            "x-aiops-priority": "realtime"},
                   json={"model": EMBED, "input": "through HAProxy"})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"][0]["embedding"]) == 384


def openapi_url(stack: Settings, model: str) -> str:
    return f"{stack.serve_url}/v1/models/{model}/openapi.json"


@pytest.mark.stack
def test_the_document_is_served_behind_the_api_key(stack: Settings) -> None:
    key = {"authorization": f"Bearer {API_KEY}"}
    refused = httpx.get(openapi_url(stack, "echo"))
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(openapi_url(stack, "echo"),
                     headers={"authorization": "Bearer wrong-key-0123456789"}).status_code == 401
    r = httpx.get(openapi_url(stack, "echo"), headers=key)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    [echo] = [s for s in load_specs(MODELS) if s.name == "echo"]
    assert r.content == document_bytes(echo)  # the same bytes as offline
    assert r.headers["etag"] == f'"{r.json()["info"]["x-aiops-digest"]}"'
    # The model list is behind the same key: what is served is not public either.
    assert httpx.get(f"{stack.serve_url}/v1/models").status_code == 401
    listed = httpx.get(f"{stack.serve_url}/v1/models", headers=key).json()["data"]
    assert "echo" in {m["id"] for m in listed}
    missing = httpx.get(openapi_url(stack, "gpt-9"), headers=key)
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "model 'gpt-9' does not exist; see GET /v1/models", "param": "model",
        "type": "invalid_request_error", "code": "model_not_found"}
    no_version = httpx.get(openapi_url(stack, "echo"), params={"version": "v9"}, headers=key)
    assert no_version.status_code == 404 and "has no version 'v9'" in no_version.text
    # The CLI fails the same way, exit 1.
    result = cli(["sdk", "generate", "gpt-9", "--out", "unused"], settings_env(stack))
    assert result.exit_code == 1 and "does not exist" in said(result)


@pytest.mark.stack
def test_a_generated_client_calls_the_stack(stack: Settings, load: Any) -> None:
    env = settings_env(stack)  # the CLI fetches with the stack's first API key
    echo = load(["echo"], "sdk_live_echo", env)
    embed = load([EMBED], "sdk_live_embed", env)
    m = echo.models
    with echo.Client(stack.serve_url, API_KEY) as client:
        out = client.create_chat_completion(m.ChatCompletionRequest(
            model="echo", messages=[m.Message(role="user", content="ping")]))
        assert isinstance(out, m.ChatCompletion)
        assert out.model == "echo" and out.choices[0].message.content == "ping"
        assert isinstance(out.usage, m.Usage) and out.usage.total_tokens >= 1
        text = client.create_completion(m.CompletionRequest(model="echo", prompt="pong"))
        assert isinstance(text, m.Completion) and text.choices[0].text
    with embed.Client(stack.serve_url, API_KEY) as client:
        vectors = client.create_embedding(embed.models.EmbeddingRequest(
            model=EMBED, input=["the GPU ran out of memory", "disk full"]))
        assert isinstance(vectors, embed.models.EmbeddingList)
        assert [len(d.embedding) for d in vectors.data] == [384, 384]
    with echo.Client(stack.serve_url, "wrong-key-0123456789") as client, \
            pytest.raises(echo.ApiError) as refused:
        client.create_chat_completion(m.ChatCompletionRequest(
            model="echo", messages=[m.Message(role="user", content="ping")]))
    assert refused.value.status == 401
    assert refused.value.error.error.code == "invalid_api_key"


@pytest.mark.stack
def test_a_schema_change_on_the_stack_changes_the_client(stack: Settings, load: Any) -> None:
    env = settings_env(stack)
    old = load(["echo"], "sdk_old", env)
    models = yaml.safe_load(MODELS.read_text())["models"]
    v2 = {**models[0], "version": "v2", "traffic": 0, "input_schema": {
        "type": "object", "required": ["tenant"],
        "properties": {"tenant": {"type": "string", "minLength": 1}}}}
    specs = [{**models[0], "traffic": 100}, v2, *models[1:]]
    key = {"authorization": f"Bearer {API_KEY}"}

    def served(**params: str) -> dict[str, Any]:
        r = httpx.get(openapi_url(stack, "echo"), headers=key, params=params)
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        return doc

    with LifecycleClient.from_settings(stack) as control:
        control.apply([ModelSpec.model_validate(s).model_dump(mode="json") for s in specs])
        # Before it takes traffic, the new version's document is there to generate from; the
        # stable URL still documents the version serving.
        ahead = served(version="v2")
        assert "tenant" in ahead["components"]["schemas"]["ChatCompletionRequest"]["required"]
        assert served()["info"]["x-aiops-digest"] == old.DIGEST
        control.promote("echo", "v2")
    deadline = time.monotonic() + 30  # the ingress takes the new routing table in place
    while served()["info"]["version"] != "v2":
        assert time.monotonic() < deadline, "the ingress still documents v1"
        time.sleep(0.5)
    new = load(["echo"], "sdk_new", env)
    assert new.VERSION == "v2" and new.DIGEST == ahead["info"]["x-aiops-digest"] != old.DIGEST
    field = new.models.ChatCompletionRequest.model_fields["tenant"]
    assert field.annotation is str and field.is_required()
    # The old client's request no longer satisfies the model; the new one's does.
    with old.Client(stack.serve_url, API_KEY) as client, pytest.raises(old.ApiError) as bad:
        client.create_chat_completion(old.models.ChatCompletionRequest(
            model="echo", messages=[old.models.Message(role="user", content="hi")]))
    assert bad.value.status == 400 and "tenant" in str(bad.value)
    with new.Client(stack.serve_url, API_KEY) as client:
        out = client.create_chat_completion(new.models.ChatCompletionRequest(
            model="echo", tenant="acme", messages=[new.models.Message(role="user",
                                                                      content="hi")]))
    assert out.choices[0].message.content == "hi"

"""Client SDKs: a typed Python package per model, from the model's OpenAPI document.

The document comes from the running stack (``GET /v1/models/{model}/openapi.json`` on the
Serve endpoint) or is built offline from a spec file (``serve.openapi``; the same spec gives
the same bytes either way). datamodel-code-generator turns its schemas into pydantic models
(``models.py``); the package's ``client.py`` is one typed method per operation of the
document over httpx, each taking and returning those models. The package installs with pip
and needs only httpx, pydantic and typing-extensions.
"""

from __future__ import annotations

import json
import keyword
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from aiops.errors import AIOpsError, StackError

__all__ = ["MAX_DOCUMENT_BYTES", "GeneratedPackage", "SdkError", "fetch_document",
           "generate_package", "offline_document", "package_name"]

MAX_DOCUMENT_BYTES = 8 * 2**20
MARKER = ".aiops-sdk"  # in a package directory this module wrote (and may replace)
# datamodel-code-generator: pydantic v2 models for Python 3.11, constraints in Annotated
# fields, Literal for enums and consts, type aliases rather than root models for constrained
# union branches (so a plain str is a valid argument for `str | list[...]`), and its own
# formatter (no black/isort run).
CODEGEN_OPTIONS = (
    "--input-file-type", "openapi",
    "--output-model-type", "pydantic_v2.BaseModel",
    "--target-python-version", "3.11",
    "--use-annotated", "--use-standard-collections", "--use-union-operator",
    "--enum-field-as-literal", "all", "--use-schema-description", "--use-double-quotes",
    "--keep-field-defaults-off-branch-roots", "--use-type-alias", "--disable-timestamp",
    "--formatters", "builtin",
)


# What may appear in generated code from a (fetched) document; see serve.specs.ModelSpec.
_NAME = r"[a-z0-9][a-z0-9._-]{0,62}"
_VERSION = r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_PATH = r"/v1/[a-z/]+"
_SUMMARY = r"[A-Za-z0-9 ,.()/-]{0,200}"


class SdkError(AIOpsError):
    """No document for the model, or no package could be generated from it."""


@dataclass(frozen=True)
class GeneratedPackage:
    path: Path  # the project directory (pip install PATH)
    package: str  # the import name
    model: str
    version: str
    digest: str
    operations: tuple[str, ...]


def package_name(model: str) -> str:
    """The default import name of a model's client: ``aiops_client_<model>``."""
    return "aiops_client_" + re.sub(r"[^0-9a-zA-Z_]", "_", model).lower()


def fetch_document(base_url: str, model: str, api_key: str | None = None,
                   version: str | None = None, timeout_s: float = 30.0) -> bytes:
    """The model's document from the running stack's Serve endpoint."""
    url = f"{base_url.rstrip('/')}/v1/models/{quote(model, safe='')}/openapi.json"
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=timeout_s) as http, http.stream(
                "GET", url, headers=headers,
                params={"version": version} if version else None) as resp:
            body = b""
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise SdkError(f"{url}: the document is over {MAX_DOCUMENT_BYTES} bytes")
    except httpx.HTTPError as exc:
        raise StackError(f"cannot reach the Serve endpoint at {base_url}: {exc}; is the stack "
                         "up (`aiops up`)? Or build the document offline with --spec") from exc
    if resp.status_code != 200:
        raise SdkError(f"{url}: HTTP {resp.status_code}: {_error_text(body)}")
    return body


def _error_text(body: bytes) -> str:
    """The message of an OpenAI-style error body, else the body's start."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return body[:500].decode(errors="replace") if body else "no body"


def offline_document(spec_file: Path, model: str, version: str | None = None) -> bytes:
    """The model's document built from a spec file: the version with the most traffic (as
    the ingress answers), or the one named."""
    from serve.openapi import document_bytes
    from serve.specs import load_specs

    specs = [s for s in load_specs(spec_file) if s.name == model]
    if not specs:
        raise SdkError(f"{spec_file} has no model {model!r}")
    if version is not None:
        specs = [s for s in specs if s.version == version]
        if not specs:
            raise SdkError(f"{spec_file}: model {model!r} has no version {version!r}")
    spec = max(specs, key=lambda s: 100 if s.traffic is None else s.traffic)
    return document_bytes(spec)


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(path, operationId, summary, request class, response class) of each operation."""
    out = []
    ref = "#/components/schemas/"
    for path, item in sorted(doc.get("paths", {}).items()):
        for op in item.values():
            body = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            answer = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
            out.append((path, op["operationId"], op.get("summary", ""),
                        body.removeprefix(ref), answer.removeprefix(ref)))
    return out


def _identifier(name: str, what: str) -> str:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise SdkError(f"the document's {what} {name!r} is not a Python identifier")
    return name


def _client_module(doc: dict[str, Any], classes: set[str]) -> str:
    info = doc["info"]
    methods = []
    for path, op_id, summary, request, response in _operations(doc):
        if not re.fullmatch(_PATH, path) or not re.fullmatch(_SUMMARY, summary):
            raise SdkError(f"operation {op_id!r}: unexpected path or summary in the document")
        for cls in (request, response):
            if cls not in classes:
                raise SdkError(f"the generator made no class {cls!r} (operation {op_id})")
        methods.append(f'''
    def {_identifier(op_id, "operationId")}(self, body: models.{request}) -> models.{response}:
        """POST {path}: {summary}."""
        return self._post({path!r}, body, models.{response})
''')
    name, version = info["x-aiops-model"]["name"], info["version"]
    return f'''"""Typed client of model {name!r} (version {version}), generated by
`aiops sdk generate` from its OpenAPI document {info["x-aiops-digest"]}.
Regenerate it rather than edit it."""

from __future__ import annotations

from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from . import models

MODEL = {info["x-aiops-model"]["name"]!r}
VERSION = {info["version"]!r}
DIGEST = {info["x-aiops-digest"]!r}
_Answer = TypeVar("_Answer", bound=BaseModel)


class ApiError(Exception):
    """An error answer: the HTTP status and, when the body has OpenAI's error shape, it."""

    def __init__(self, status: int, error: models.ErrorResponse | None, text: str) -> None:
        super().__init__(f"HTTP {{status}}: {{error.error.message if error else text[:500]}}")
        self.status = status
        self.error = error


class Client:
    """``base_url``: the Serve endpoint (e.g. http://127.0.0.1:8000); ``api_key``: one of
    the stack's API keys, when it has any. Answers are validated into the models; stream=True
    is refused (this client reads whole answers)."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = 120.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {{"authorization": f"Bearer {{api_key}}"}} if api_key else {{}}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                                  timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, path: str, body: BaseModel, answer: type[_Answer]) -> _Answer:
        if getattr(body, "stream", False):
            raise ValueError("this client does not stream: leave stream unset")
        resp = self._http.post(path, content=body.model_dump_json(by_alias=True,
                                                                   exclude_none=True),
                               headers={{"content-type": "application/json"}})
        if resp.status_code >= 400:
            try:
                error: models.ErrorResponse | None = \\
                    models.ErrorResponse.model_validate_json(resp.content)
            except ValidationError:
                error = None
            raise ApiError(resp.status_code, error, resp.text)
        return answer.model_validate_json(resp.content)
{"".join(methods)}'''


def _pyproject(dist: str, package: str, doc: dict[str, Any]) -> str:
    info = doc["info"]
    local = re.sub(r"[^0-9a-zA-Z]+", ".", info["version"]).strip(".").lower() or "0"
    version = f"0+{local}.{info['x-aiops-digest'].removeprefix('sha256:')[:12]}"
    return f'''# Generated by `aiops sdk generate` from {info["x-aiops-digest"]}.
[build-system]
requires = ["setuptools>=70.1"]
build-backend = "setuptools.build_meta"

[project]
name = {dist!r}
version = {version!r}
description = {f"Typed client of model {info['x-aiops-model']['name']} (aiops)"!r}
requires-python = ">=3.11"
dependencies = ["httpx>=0.27", "pydantic>=2.7", "typing-extensions>=4.12"]

[tool.setuptools]
packages = [{package!r}]

[tool.setuptools.package-data]
{package} = ["py.typed", "openapi.json"]
'''


def generate_package(document: bytes, out: Path, package: str | None = None,
                     force: bool = False, timeout_s: float = 300.0) -> GeneratedPackage:
    """Write the client package of ``document`` to ``out`` (a directory this function made
    before is replaced; anything else there is refused unless ``force``)."""
    try:
        doc = json.loads(document)
        info = doc["info"]
        model, version, digest = (info["x-aiops-model"]["name"], info["version"],
                                  info["x-aiops-digest"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SdkError(f"not an aiops model document: {exc}") from exc
    # These go into generated code: only what a spec and serve.openapi can produce.
    for value, pattern in ((model, _NAME), (version, _VERSION), (digest, _DIGEST)):
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            raise SdkError(f"not an aiops model document: {value!r} does not match {pattern}")
    package = _identifier(package or package_name(model), "package name")
    if out.exists() and not out.is_dir():
        raise SdkError(f"{out} is not a directory")
    if out.exists() and not (out / MARKER).exists() and any(out.iterdir()) and not force:
        raise SdkError(f"{out} exists and was not made by `aiops sdk generate`; "
                       "choose another --out or pass --force")
    out.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        pkg = root / package
        pkg.mkdir()
        (pkg / "openapi.json").write_bytes(document)
        _codegen(pkg / "openapi.json", pkg / "models.py", timeout_s)
        classes = set(re.findall(r"^class (\w+)\(", (pkg / "models.py").read_text(), re.M))
        (pkg / "client.py").write_text(_client_module(doc, classes))
        (pkg / "__init__.py").write_text(
            f'"""Typed client of model {model!r}; see client.Client."""\n\n'
            "from . import models\n"
            "from .client import DIGEST, MODEL, VERSION, ApiError, Client\n\n"
            '__all__ = ["DIGEST", "MODEL", "VERSION", "ApiError", "Client", "models"]\n')
        (pkg / "py.typed").write_text("")
        (root / "pyproject.toml").write_text(_pyproject(package.replace("_", "-"), package, doc))
        (root / MARKER).write_text(json.dumps({"model": model, "version": version,
                                               "digest": digest}) + "\n")
        if out.exists():
            shutil.rmtree(out)
        root.rename(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return GeneratedPackage(out, package, model, version, digest,
                            tuple(op for _, op, *_ in _operations(doc)))


def _codegen(document: Path, output: Path, timeout_s: float) -> None:
    cmd = [sys.executable, "-m", "datamodel_code_generator", "--input", str(document),
           "--output", str(output), *CODEGEN_OPTIONS]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                             check=False)
    except FileNotFoundError as exc:
        raise SdkError(f"cannot run the generator: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise SdkError(f"datamodel-code-generator ran over {timeout_s:g} s") from exc
    if run.returncode != 0 or not output.is_file():
        tail = (run.stderr or run.stdout).strip().splitlines()[-5:]
        if "No module named datamodel_code_generator" in run.stderr:
            tail = ["datamodel-code-generator is not installed: pip install 'aiops[sdk]'"]
        raise SdkError("datamodel-code-generator failed: " + " | ".join(tail))

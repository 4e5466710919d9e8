"""The import layers (docs/architecture.md): the contracts of ``[tool.importlinter]`` in
pyproject.toml hold, and the harness (benchmarks, the demo, evaluations) stays off the runtime's
import path, which import-linter cannot see through the command line's by-name mounting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aiops.cli import HARNESS, app

ROOT = Path(__file__).resolve().parents[2]
HARNESS_PACKAGES = ("aiops.bench", "aiops.demo", "aiops.evals", "agents.evals")


def _loaded_after(code: str) -> list[str]:
    """The harness modules a fresh interpreter holds after running ``code``."""
    probe = (f"import json, sys\n{code}\nprint(json.dumps(sorted(m for m in sys.modules if "
             f"m.split('.')[:2] in {[p.split('.') for p in HARNESS_PACKAGES]!r})))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_the_command_line_loads_no_harness() -> None:
    # `python -m aiops server` (what `aiops up` starts) imports aiops.cli and runs a command.
    assert _loaded_after("import aiops.cli") == []
    assert _loaded_after(
        "from typer.testing import CliRunner\n"
        "import typer.main, aiops.cli\n"
        "names = typer.main.get_command(aiops.cli.app).list_commands(None)\n"
        "assert {'bench', 'demo', 'eval'} <= set(names), names\n"
        "done = CliRunner().invoke(aiops.cli.app, ['server', '--help'])\n"
        "assert done.exit_code == 0, done.output") == []


def test_the_probe_sees_a_harness_import() -> None:
    # The check above would pass vacuously if the probe matched nothing.
    assert "aiops.bench.cli" in _loaded_after("import aiops.bench.cli")


@pytest.mark.parametrize("name", sorted(HARNESS))
def test_harness_commands_are_mounted_by_name(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"], prog_name="aiops")
    assert result.exit_code == 0, result.output
    assert f"Usage: aiops {name} [OPTIONS]" in " ".join(result.output.split())


def test_harness_commands_are_listed_where_they_were() -> None:
    import typer.main

    names = typer.main.get_command(app).list_commands(None)
    for name, (_, after) in HARNESS.items():
        assert names.index(name) == names.index(after) + 1, names
    assert len(names) == len(set(names))


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    if not lint_imports.exists():
        pytest.skip(f"import-linter is not installed in this environment ({lint_imports} is "
                    "missing): install the dev extra (`make install`)")
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_the_contracts_that_list_agents_modules_list_every_one() -> None:
    # agents.evals (harness) lives inside agents, so contracts 3 and 5 name agents' runtime
    # modules one by one; a new module must not slip past them.
    import tomllib

    contracts = {c["id"]: c for c in tomllib.loads(
        (ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]}
    runtime = {f"agents.{p.stem if p.is_file() else p.name}"
               for p in (ROOT / "agents").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__")
               or (p.is_dir() and (p / "__init__.py").is_file() and p.name != "evals")}
    for cid in ("no-harness-in-runtime", "analyzer-wired-by-server"):
        listed = {m for m in contracts[cid]["source_modules"] if m.startswith("agents.")}
        assert listed == runtime, (cid, sorted(runtime - listed), sorted(listed - runtime))

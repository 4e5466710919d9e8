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
HARNESS_PACKAGE = "aiops_harness"


def _loaded_after(code: str) -> list[str]:
    """The harness modules a fresh interpreter holds after running ``code``."""
    probe = (f"import json, sys\n{code}\nprint(json.dumps(sorted(m for m in sys.modules if "
             f"m.split('.')[0] == {HARNESS_PACKAGE!r})))")
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
    assert "aiops_harness.bench.cli" in _loaded_after("import aiops_harness.bench.cli")


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


def test_the_runtime_contracts_cover_every_product_package_whole() -> None:
    """The harness is a package of its own, so the contracts that keep it (and the live
    analyzer's wiring) out of the runtime name whole packages: a new module cannot slip past."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    contracts = {c["id"]: c for c in config["importlinter"]["contracts"]}
    product = set(config["importlinter"]["root_packages"]) - {HARNESS_PACKAGE}
    assert set(contracts["no-harness-in-runtime"]["source_modules"]) == product
    assert contracts["no-harness-in-runtime"]["forbidden_modules"] == [HARNESS_PACKAGE]
    assert {"agents", "dashboards", "serve", "collectors"} <= set(
        contracts["analyzer-wired-by-server"]["source_modules"])


def test_the_product_wheel_holds_no_harness() -> None:
    """The root pyproject's packages (what its wheel holds) are the product's alone; the
    harness is harness/'s distribution."""
    import tomllib

    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_packages(str(ROOT), include=config["packages"]["find"]["include"])
    assert packages and not [p for p in packages if p.split(".")[0] == HARNESS_PACKAGE]
    assert {p.split(".")[0] for p in packages} == {"aiops", "serve", "collectors", "agents",
                                                   "dashboards"}


def test_the_product_runs_where_the_harness_is_not_installed() -> None:
    """Without the harness's distribution (no entry points, no package), ``aiops`` lists and
    runs the runtime's commands, and offers none of the harness's."""
    code = (
        "import importlib.abc, importlib.metadata, sys\n"
        "class NoHarness(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {HARNESS_PACKAGE!r}:\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, NoHarness())\n"
        "real = importlib.metadata.entry_points\n"
        "importlib.metadata.entry_points = lambda **kw: [] if kw.get('group') == "
        "'aiops.harness' else real(**kw)\n"
        "from typer.testing import CliRunner\n"
        "import typer.main, aiops.cli\n"
        "names = typer.main.get_command(aiops.cli.app).list_commands(None)\n"
        "assert not {'bench', 'demo', 'eval'} & set(names), names\n"
        "for args in (['--help'], ['server', '--help'], ['config', 'schema']):\n"
        "    done = CliRunner().invoke(aiops.cli.app, args)\n"
        "    assert done.exit_code == 0, (args, done.output)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr

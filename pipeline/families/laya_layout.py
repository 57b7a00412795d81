"""The Laya layout, read and written: load, save and build the stock base. Both families read it (the laya
family as its own format, the joint family for the encoder inside), so it sits below both.

The model class and the sequence builder come from `laya` (Apache-2.0), so a checkpoint written here loads in
`laya.Agent` and one written by laya loads here. The layout (docs/training.md, Model families):

    rl_agent_config.json   encoder, head_layers, act_costs, temperature, max_len, head_max_len, ...
    model.safetensors      encoder.*, head.*, type_emb.*, scorer.*, act_head.*, temperature (fp16)
    encoder/config.json    the encoder's config
    tokenizer/             tokenizer files

    python -m pipeline.stages.dvc snapshot     # build the stock MiniLM base (dvc repro snapshot)
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.families.base import ModelLayoutError
from pipeline.families.exporting import load_weights, read_calibrator
from pipeline.scoring.calibrators import Calibrator

CONFIG_FILE = "rl_agent_config.json"


@dataclass
class LoadedModel:
    """A decision model with its tokenizer and decision config."""

    model: torch.nn.Module
    tokenizer: Any
    config: dict[str, Any]
    calibrator: Calibrator | None = None  # an export's calibrator.json; None: the config's temperatures

    @property
    def max_len(self) -> int:
        return int(self.config.get("max_len", 512))

    @property
    def head_max_len(self) -> int:
        return int(self.config.get("head_max_len", 192))


def load_model(path: str | Path) -> LoadedModel:
    """Load a Laya-layout folder on the CPU in fp32; a folder without its config is not a model.

    As laya's `load_checkpoint`, except that the folder is only read: laya rewrites an old-style
    `tokenizer_config.json` in place on first load, which would change the hash of a pinned base or export.
    """
    from laya.train import build_model
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise ModelLayoutError(f"{path}: not a decision model (no {CONFIG_FILE}; an unfinished export?)")
    config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    tokenizer = _load_tokenizer(path / "tokenizer")
    model = build_model(config, encoder_dir=str(path / "encoder"))
    model.load_state_dict(load_weights(path / "model.safetensors", load_file), strict=True)
    return LoadedModel(model.float().eval(), tokenizer, config, read_calibrator(path))


def _load_tokenizer(folder: Path):
    """The tokenizer as saved; one transformers cannot read as is is fixed up (laya's way) in a temporary
    copy."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (ValueError, KeyError, AttributeError, OSError):
        import tempfile

        from laya.agent import _fix_tokenizer_config

        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(folder, Path(tmp) / "tokenizer")
            _fix_tokenizer_config(tmp)
            return AutoTokenizer.from_pretrained(str(Path(tmp) / "tokenizer"))


def save_model(loaded: LoadedModel, path: str | Path) -> Path:
    """Write the Laya layout (weights in fp16, the config last)."""
    from laya.train import save_checkpoint

    save_checkpoint(loaded.model, loaded.tokenizer, loaded.config, str(path))
    return Path(path)


def build_base(
    encoder_dir: str | Path, seed: int, head_layers: int = 2, max_len: int = 256, head_max_len: int = 128
) -> LoadedModel:
    """A fresh decision model: a pretrained encoder from a local folder and a seeded, new head."""
    from laya.common import DecisionModel
    from transformers import AutoModel, AutoTokenizer

    encoder_dir = Path(encoder_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(encoder_dir))
    encoder = AutoModel.from_pretrained(str(encoder_dir), attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DecisionModel(encoder, head_layers=head_layers, n_act=2)
    config = {
        "encoder": encoder_dir.name,
        "head_layers": head_layers,
        "act_costs": {"defer": 0.1},
        "temperature": [1.0, 1.0, 1.0],
        "temperature_by_options": {},
        "max_len": max_len,
        "head_max_len": head_max_len,
        "amp_dtype": "bf16",
        "fine_tuned": False,
        "training": {"head_seed": seed},
    }
    return LoadedModel(model.eval(), tokenizer, config)


def write_snapshot(
    out: str | Path, encoder_dir: str | Path, seed: int, head_layers: int, max_len: int, head_max_len: int
) -> Path:
    """Build the stock base and write it to `out` atomically (a staging folder moved in whole)."""
    out = Path(out)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    save_model(build_base(encoder_dir, seed, head_layers, max_len, head_max_len), staging)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out

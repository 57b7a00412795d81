"""Training checkpoints on a tiny model: a run stopped after its checkpoint and resumed in a fresh model ends
where an uninterrupted run ends; a write cut short leaves the previous checkpoint; another config's is not
resumed."""

from dataclasses import replace

import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.data import synthetic
from pipeline.data.validate import validate_rows
from pipeline.families.laya.items import build_items
from pipeline.families.laya.training import laya_batch_task, prepare_model
from pipeline.families.laya_layout import load_model
from pipeline.training import checkpoint as checkpoint_module
from pipeline.training.checkpoint import Checkpointer, fingerprint
from pipeline.training.controls import CancelToken, RunControls, RunHooks
from pipeline.training.loop import train

CPU = torch.device("cpu")
# LoRA dropout on, so a resume that did not restore the RNG states would draw other masks and drift.
RESUMABLE = TrainConfig(
    method="lora",
    micro_batch=4,
    grad_accum=2,
    lora_r=4,
    lora_alpha=4,
    lora_dropout=0.1,
    lora_lr=5e-3,
    head_lr=1e-3,
    warmup_steps=2,
    max_steps=6,
    log_every=4,
    checkpoint_every_steps=3,
    checkpoint_every_minutes=0.0,
    precision="fp32",
)


@pytest.fixture(scope="module")
def tiny_items(tiny_base):
    records = validate_rows(synthetic.generate_rows(24, seed=5)).records
    items, _ = build_items(records, load_model(tiny_base))
    return items


def _run(tiny_base, items, checkpoints=None, stop_after=None):
    loaded = load_model(tiny_base)
    torch.manual_seed(0)  # LoRA's initialisation draws from it: each run starts from the same model
    prepare_model(loaded.model, RESUMABLE)
    cancel = CancelToken()

    def on_log(entry):  # a stop one step after the checkpoint: the work since it is lost, as in a kill
        if stop_after is not None and entry["step"] >= stop_after:
            cancel.cancel("test")

    result = train(
        loaded.model,
        items,
        RESUMABLE,
        CPU,
        laya_batch_task(loaded.tokenizer.pad_token_id),
        RunHooks(on_log=on_log),
        RunControls(cancel=cancel, checkpoints=checkpoints),
    )
    trained = {n: p.detach().clone() for n, p in loaded.model.named_parameters() if p.requires_grad}
    return result, trained


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tiny_base, tiny_items, tmp_path):
    saver = Checkpointer(tmp_path / "checkpoint.pt", RESUMABLE)
    stopped, _ = _run(tiny_base, tiny_items, saver, stop_after=4)
    assert stopped.cancelled and stopped.steps == 4  # the checkpoint holds step 3
    resumed, resumed_params = _run(tiny_base, tiny_items, Checkpointer(tmp_path / "checkpoint.pt", RESUMABLE))
    whole, whole_params = _run(tiny_base, tiny_items)

    assert resumed.resumed_from_step == 3 and whole.resumed_from_step == 0
    assert resumed.steps == whole.steps == 6
    # Step 4's loss sums steps 4 alone after the resume plus 1-3 carried in the checkpoint; step 6 is the end.
    assert [s for s, _ in resumed.losses] == [s for s, _ in whole.losses] == [4, 6]
    for (_, got), (_, want) in zip(resumed.losses, whole.losses, strict=True):
        assert got == pytest.approx(want, rel=1e-5)
    assert resumed_params.keys() == whole_params.keys()
    for name, value in whole_params.items():
        torch.testing.assert_close(resumed_params[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert [e["step"] for e in resumed.logged_steps] == [4, 6]  # the whole run's logging steps, once each


def test_a_write_cut_short_leaves_the_previous_checkpoint(tiny_base, tiny_items, tmp_path, monkeypatch):
    saver = Checkpointer(tmp_path / "checkpoint.pt", RESUMABLE)
    _run(tiny_base, tiny_items, saver, stop_after=4)
    real_save = torch.save

    def cut_short(obj, handle):  # what a kill mid-write leaves: part of the bytes, no rename
        real_save(obj, handle)
        handle.truncate(handle.tell() // 2)
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(checkpoint_module.torch, "save", cut_short)
    with pytest.raises(KeyboardInterrupt):
        _run(tiny_base, tiny_items, Checkpointer(tmp_path / "checkpoint.pt", RESUMABLE))
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)
    state = saver.load(fingerprint(RESUMABLE, len(tiny_items), 6))
    assert state is not None and state.step == 3


def test_another_configs_checkpoint_is_not_resumed(tiny_base, tiny_items, tmp_path):
    _run(tiny_base, tiny_items, Checkpointer(tmp_path / "checkpoint.pt", RESUMABLE), stop_after=4)
    path, n = tmp_path / "checkpoint.pt", len(tiny_items)
    other = replace(RESUMABLE, lora_lr=1e-3)
    assert Checkpointer(path, other).load(fingerprint(other, n, 6)) is None
    assert Checkpointer(path, RESUMABLE).load(fingerprint(RESUMABLE, n + 1, 6)) is None  # other data
    # How often checkpoints are written is not part of what is trained: a changed interval still resumes.
    every_two = replace(RESUMABLE, checkpoint_every_steps=2)
    assert Checkpointer(path, every_two).load(fingerprint(every_two, n, 6)) is not None


def test_checkpoints_fall_due_every_n_steps_or_m_minutes_and_at_the_end(tmp_path):
    now = [0.0]
    saver = Checkpointer(
        tmp_path / "c.pt",
        replace(RESUMABLE, checkpoint_every_steps=10, checkpoint_every_minutes=1.0),
        clock=lambda: now[0],
    )
    assert [s for s in range(1, 31) if saver.due(s, 25)] == [10, 20, 25, 30]
    now[0] = 61.0  # a minute since the last save: due at any step
    assert saver.due(3, 25)
    never_by_steps = Checkpointer(
        tmp_path / "c.pt", replace(RESUMABLE, checkpoint_every_steps=0, checkpoint_every_minutes=0.0)
    )
    assert [s for s in range(1, 26) if never_by_steps.due(s, 25)] == [25]

"""The pinned VADER set: its shape, label balance, and a held-out split that leaks no text."""

import pytest

from pipeline.config import load_params
from pipeline.data.split import split_holdout
from pipeline.data.validate import validate_file

pytestmark = pytest.mark.data


@pytest.fixture(scope="module")
def vader(project_root):
    return validate_file(project_root / "data/processed/vader.jsonl"), load_params(
        project_root / "params.yaml"
    )


def test_every_vader_decision_is_usable(vader):
    report = vader[0].report
    assert 23_000 < report.rows < 23_703  # 23,703 sentences less the duplicate texts
    assert report.decisions == 4 * report.rows and report.kept == report.decisions


def test_question_types_and_label_balance(vader):
    records = vader[0].records
    types = {d.question.id: d.question.type for d in records[0].decisions}
    assert types == {"tone": "choice", "is_negative": "noul", "is_positive": "noul", "intensity": "score"}
    tones = [d.gold.label for r in records for d in r.decisions if d.question.id == "tone"]
    shares = [tones.count(i) / len(tones) for i in range(3)]
    assert all(0.1 < share < 0.6 for share in shares), shares
    assert all(d.gold.probabilities is not None for r in records[:50] for d in r.decisions)


def test_heldout_split_leaks_no_text(vader):
    data, params = vader
    split = split_holdout(data.records, params.validate)
    assert sum(len(r.decisions) for r in split.heldout) == params.validate.holdout_max_decisions  # 4 per row
    train_texts = {r.state.casefold() for r in split.train}
    assert not any(r.state.casefold() in train_texts for r in split.heldout)
    assert {r.state for r in split.heldout}  # not empty


def test_rebuilding_the_dataset_gives_the_pinned_bytes(project_root, tmp_path):
    from pipeline.data.dataset import build_dataset
    from pipeline.data.pins import current_md5, pinned_outputs

    config = load_params(project_root / "params.yaml").dataset
    out = tmp_path / "vader.jsonl"
    result = build_dataset(type(config)(archive=str(project_root / config.archive), out=str(out)))
    assert current_md5(out) == pinned_outputs(project_root / "dvc.lock")["data/processed/vader.jsonl"]
    assert set(result.by_source) == {
        "tweets",
        "movieReviewSnippets",
        "nytEditorialSnippets",
        "amazonReviewSnippets",
    }
    assert b"&amp;" not in out.read_bytes() and b"&quot;" not in out.read_bytes()


def test_a_tampered_archive_is_refused(tmp_path, project_root):
    from pipeline.config import DatasetConfig
    from pipeline.data.dataset import ArchiveMismatch, build_dataset

    fake = tmp_path / "vaderSentiment-3.3.2.tar.gz"
    fake.write_bytes(b"not the archive")
    with pytest.raises(ArchiveMismatch, match="differs from the pinned"):
        build_dataset(DatasetConfig(archive=str(fake), out=str(tmp_path / "x.jsonl")))
    assert not (tmp_path / "x.jsonl").exists()

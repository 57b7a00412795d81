"""benchmarks/bench_certify.py end to end on a tiny run: certified and naive figures at each ε, the windows, and
the export's served shares in scope and on planted out-of-scope states."""

import json
from dataclasses import replace

from benchmarks import bench_certify
from pipeline.config import ValidateConfig
from pipeline.data.split import TrainSource
from pipeline.stages.finetune import finetune
from tests.tiny import JOINT_HEAD, write_learnable_rows

SPLIT = ValidateConfig(holdout_fraction=0.25, validation_fraction=0.2, validation_min_decisions=5)


def test_a_run_folder_gets_its_table_and_json(tiny_base, tmp_path, capsys):
    rows = write_learnable_rows(tmp_path / "rows.jsonl", 120, seed=4)
    config = replace(JOINT_HEAD, epochs=4, threads=1, lexicon="tokens", out_of_fold_below=10_000)
    result = finetune(TrainSource(rows, split_config=SPLIT), tiny_base, tmp_path / "export", config, "cpu")
    out = tmp_path / "bench_certify.json"
    argv = ["--datasets", "tiny", "--run", f"tiny={result.run_dir}", "--epsilons", "0.1,0.3"]
    assert (
        bench_certify.main([*argv, "--windows", "5", "--window", "20", "--rounds", "1", "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert (
        "with out-of-fold answers" in printed and "naive 0.9" in printed and "in scope (held out)" in printed
    )
    (figures,) = json.loads(out.read_text())
    assert [at["epsilon"] for at in figures["at"]] == [0.1, 0.3]
    for at in figures["at"]:
        tone = at["by_question"]["tone"]
        assert 0 <= tone["certified"]["coverage"] <= tone["in_sample_coverage"] + 0.5
        assert 0 <= at["windows"]["within"] <= 1 and at["windows"]["windows"] == 5
    shares = figures["served"]["shares"]
    assert set(shares) == {"in scope (held out)", *bench_certify.planted_states()}
    assert shares["empty-ish"]["novel"] == 1.0 and shares["empty-ish"]["none_automated"] == 1.0
    assert figures["served"]["throughput"]["ratio"] > 0 and "throughput with the gate / without" in printed

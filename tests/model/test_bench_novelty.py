"""benchmarks/bench_novelty.py --smoke: the gate's cost and verdicts measured end to end on a tiny model."""

import json

from benchmarks import bench_novelty


def test_the_smoke_run_prints_the_ratio_and_the_flagged_shares_and_writes_them(tmp_path, capsys):
    out = tmp_path / "bench_novelty.json"
    assert bench_novelty.main(["--smoke", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ratio (with / without" in printed and "flagged novel:" in printed
    result = json.loads(out.read_text())
    assert result["ratio"] > 0 and set(result["requests_per_s"]) == {"without gate", "with gate"}
    shares = result["flagged"]
    assert set(shares) == {"in scope (held out)", *bench_novelty.planted_states()}
    assert shares["in scope (held out)"] <= 0.1 and shares["empty-ish"] == 1.0  # nothing to read: novel


def test_a_missing_model_or_data_is_one_line_and_exit_2(tmp_path, capsys):
    assert bench_novelty.main(["--model", str(tmp_path / "none"), "--out", str(tmp_path / "x.json")]) == 2
    assert "not found" in capsys.readouterr().err

"""``onepass bench`` end to end at toy sizes: every section is measured and written."""

from __future__ import annotations

import json

import pytest

from onepass.bench import BANKING_SUBSET, BenchConfig, datasets, run


def test_bench_datasets_are_fixed_and_disjoint(data_dir):
    config = BenchConfig(data_dir=data_dir, limit=20, fit_limit=20)
    a, b = datasets(config), datasets(config)
    for name in ("clinc150", "banking77", "clinc150-noul"):
        states = [r.request.state for r in a[name]["test"]]
        assert states == [r.request.state for r in b[name]["test"]]  # seeded: the same
        assert len(states) == 20
        fit = {r.request.state for r in a[name]["fit"]}
        assert not fit & set(states), "calibration must be fitted on other records"
    q = a["banking77"]["test"][0].request.questions[0]
    assert set(q.options) == set(BANKING_SUBSET)
    golds = [r.answers[0] for r in a["clinc150-noul"]["test"]]
    assert a["clinc150-noul"]["test"][0].request.questions[0].type == "noul"
    assert golds.count(0) == golds.count(1) == 10  # half about the request's own domain


@pytest.mark.proof
def test_bench_writes_every_section(engine, data_dir, tmp_path):
    """Toy sizes (3 BANKING77 intents, 3 scored records): the structure, not the numbers."""
    config = BenchConfig(data_dir=data_dir, output=tmp_path / "bench", limit=3, fit_limit=8,
                         teach=(1,), flip_records=2, latency_requests=1, domains=None,
                         datasets=("banking77",), banking_intents=BANKING_SUBSET[:3],
                         compare_combine=False)
    stages = []
    report = run(engine, config, lambda stage, done, total: stages.append(stage))
    rows = report["results"]["banking77"]
    assert set(rows) == {"none", "none+calibration", "name-order", "name-order+calibration",
                         "rotations", "rotations+calibration",
                         "rotations+content-free", "rotations+content-free+calibration",
                         "none+teach1"}
    for row in rows.values():
        assert row["n"] == 3 and 0 <= row["accuracy"] <= 1 and 0 <= row["ece"] <= 1
        assert 0 < row["label_mass"] <= 1  # the median answer's mass on the option labels
    assert report["flip"]["name-order"]["mean_tv"] == 0.0  # one prompt for every order
    for debias in ("rotations", "rotations+content-free"):
        assert report["flip"][debias]["flip_rate"] == 0.0
        assert report["flip"][debias]["mean_tv"] < 1e-3
    assert report["latency"]["rotations"]["miss_ms"] > 0
    folder = tmp_path / "bench"
    text = (folder / "REPORT.md").read_text()
    assert "| banking77 | rotations |" in text and "flip rate" in text
    assert "| NLL | label mass | n |" in text
    assert json.loads((folder / "report.json").read_text())["limit"] == 3
    assert (folder / "reliability_banking77.png").stat().st_size > 5_000
    assert "banking77 rotations" in stages


def test_bench_measures_only_the_readings_asked_for(engine, data_dir, tmp_path):
    """``--debias-settings none``: one reading (and its calibration) per dataset, and the
    flip rate and latency for that reading alone."""
    config = BenchConfig(data_dir=data_dir, output=tmp_path / "bench", limit=3, fit_limit=8,
                         teach=(), flip_records=2, latency_requests=1, domains=None,
                         datasets=("banking77",), banking_intents=BANKING_SUBSET[:3],
                         debias_settings=("none",))
    report = run(engine, config)
    assert set(report["results"]["banking77"]) == {"none", "none+calibration"}
    assert set(report["flip"]) == set(report["latency"]) == {"none"}


@pytest.mark.parametrize("value", ["bogus", "", "none,,bogus", "rotations+bogus"])
def test_bench_refuses_an_unknown_reading_naming_the_flag(value, capsys):
    from onepass.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--debias-settings", value])
    assert exit_info.value.code == 2
    assert "--debias-settings" in capsys.readouterr().err

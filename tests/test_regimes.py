"""The error label of a prediction (suite.predict.regimes): every printed error names its regime
and n, or says the regime is not scored and names the one shown instead; how the scorers count
fit each way apart; suite-predict's rows each with their regime's label."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml

from suite.config.compose import trial
from suite.predict.regimes import MIN_N, Regime, error_label, fit_counts, fit_label, gpu_class, regime

ROOT = Path(__file__).resolve().parents[1]
PYTHIA_160M = 162_322_944

EXPECTED_CLASS = {
    "a100-40gb": "datacenter-sxm",
    "a100-80gb": "datacenter-sxm",
    "a100-pcie-40gb": "datacenter-pcie",
    "a100-pcie-80gb": "datacenter-pcie",
    "a6000": "consumer-workstation",
    "gh200-144gb": "datacenter-sxm",
    "gh200": "datacenter-sxm",
    "h100-nvl": "datacenter-pcie",
    "h100-pcie": "datacenter-pcie",
    "h100-sxm": "datacenter-sxm",
    "h200-nvl": "datacenter-pcie",
    "h200": "datacenter-sxm",
    "l40s": "consumer-workstation",
    "rtx-3090": "consumer-workstation",
    "rtx-4090": "consumer-workstation",
    "v100-16gb": "datacenter-sxm",
    "v100-pcie-16gb": "datacenter-pcie",
    "v100-pcie-32gb": "datacenter-pcie",
    "v100": "datacenter-sxm",
}


def test_every_gpu_profile_has_its_class():
    profiles = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "conf" / "hardware").glob("*.yaml"))}
    gpus = {name: d["gpu"] for name, d in profiles.items() if d.get("device") == "cuda"}
    assert {name: gpu_class(gpu) for name, gpu in gpus.items()} == EXPECTED_CLASS
    with pytest.raises(ValueError, match="no GPU class"):
        gpu_class("Some Accelerator 9000")


def test_a_trials_regime_and_its_relaxed_levels():
    t = trial(["model=pythia-160m", "hardware=rtx-3090", "hardware.count=1"])
    t = replace(t, methods=replace(t.methods, engine="deepspeed", zero_stage=0, offload="none"))
    r = regime(t, PYTHIA_160M)
    assert r == Regime("consumer-workstation", "ddp", "none", "1", "<1B")
    assert r.text == "consumer-workstation · DDP · no offload · 1 GPU · <1B"
    assert [x.text for x in r.levels()][1:] == [
        "consumer-workstation · DDP · no offload · 1 GPU",  # size band relaxed first
        "consumer-workstation · DDP · 1 GPU",  # then offload
        "consumer-workstation · 1 GPU",  # then the engine
        "consumer-workstation",  # then the GPU count; never the class
    ]
    assert Regime.from_key(r.levels()[2].key) == r.levels()[2]
    big = replace(t, hardware=replace(t.hardware, count=4), nodes=4)
    big = replace(big, methods=replace(big.methods, engine="deepspeed", zero_stage=3, offload="optimizer"))
    assert regime(big, 6_900_000_000).text == "consumer-workstation · ZeRO-3 · offload · >8 GPUs · 1-7B"
    fsdp = replace(t, methods=replace(t.methods, engine="fsdp2"))
    assert regime(fsdp, 7_200_000_000).key == "consumer-workstation|fsdp|none|1|>7B"


def stats(n: int, median: float, p90: float | None = None) -> dict:
    return {"n": n, "median": median, "p90": p90 if p90 is not None else 2 * median, "max": 3 * median}


def entry(n: int, step: float, memory: dict | None = None, fit: dict | None = None) -> dict:
    return {"n": n, "step_time_err_pct": stats(n, step), "memory_err_pct_by_kind": memory or {}, "fit": fit or {}}


@pytest.fixture
def accuracy(tmp_path, monkeypatch):
    """An empty results/accuracy/ for the labels to read; write(kind, summary) fills it."""
    monkeypatch.setattr("suite.paths.accuracy_dir", lambda: tmp_path)

    def write(kind: str, summary: dict) -> None:
        (tmp_path / f"{kind}.json").write_text(json.dumps(summary))

    return write


def rtx3090(*extra: str):
    t = trial(["model=pythia-160m", "hardware=rtx-3090", *extra])
    return replace(t, methods=replace(t.methods, engine="deepspeed", zero_stage=0, offload="none"))


DATACENTER = Regime("datacenter-sxm", "ddp", "none", "1", "<1B")


def test_a_consumer_card_never_carries_the_datacenter_figure_unnamed(accuracy):
    """Datacenter runs are plenty (±9%) and consumer ones too few: the consumer label says its class is
    not scored and names the regime it shows, with its class; with enough consumer runs in the class
    (but too few in its own regime), it shows the class's nearest level, never the datacenter's."""
    t = rtx3090("hardware.count=1")
    sxm = {x.key: entry(40, 9.0) for x in DATACENTER.levels()}
    few = {x.key: entry(2, 30.0) for x in regime(t, PYTHIA_160M).levels()}
    accuracy("cuda-published", {"by_regime": sxm | few})
    label = error_label(t, "step", PYTHIA_160M)
    assert label.regime.gpu_class == "consumer-workstation" and not label.own
    assert label.source == DATACENTER and label.n == 40 and label.cell == "±9%*"
    assert label.long.startswith("step time: not scored on consumer-workstation cards (n=2 < 5 in consumer-")
    assert "nearest regime datacenter-sxm · DDP · no offload · 1 GPU · <1B: ±9% median, 18% p90, n=40" in label.long

    mine = regime(t, PYTHIA_160M)
    rel = mine.levels()
    accuracy("cuda-published", {"by_regime": sxm | {rel[0].key: entry(2, 30.0), rel[3].key: entry(9, 15.0)}})
    label = error_label(t, "step", PYTHIA_160M)
    assert label.source == rel[3] and label.median_pct == 15.0 and label.short == "±15% (n=9, nearest)"
    assert label.long == (
        f"step time: not scored in {mine.text} (n=2 < {MIN_N}); nearest regime consumer-workstation · 1 GPU: "
        "±15% median, 30% p90, n=9 published runs"
    )
    accuracy("cuda-published", {"by_regime": {rel[0].key: entry(23, 12.0)}})
    label = error_label(t, "step", PYTHIA_160M)
    assert label.own and label.short == "±12% (n=23)"
    assert label.long == f"step time ±12% median, 24% p90, n=23 published runs in {mine.text}"


def test_the_committed_published_label_of_a_consumer_card_is_its_class_or_says_it_is_not():
    """pythia-160m on one RTX 3090, labelled from results/accuracy/cuda-published.json as shipped."""
    t = rtx3090("hardware.count=1")
    for quantity in ("step", "memory"):
        label = error_label(t, quantity, PYTHIA_160M)
        assert label.regime.text in label.long and re.search(r"n=\d+", label.long), label.long
        if label.source is not None and label.source.gpu_class != "consumer-workstation":
            assert "not scored on consumer-workstation cards" in label.long and label.source.text in label.long
        if label.source is None:
            assert "every regime" in label.long or not label.scored


def test_a_memory_label_is_of_its_kind_within_the_regime_or_over_every_regime_said_so(accuracy):
    t = rtx3090("hardware.count=2")
    mine = regime(t, PYTHIA_160M)
    memory = {"allocated": stats(6, 4.0), "nvidia-smi": stats(2, 40.0)}
    accuracy(
        "cuda-published",
        {
            "by_regime": {mine.key: entry(6, 10.0, memory)},
            "memory_err_pct_by_kind": {"nvidia-smi": stats(25, 19.0, 31.0), "allocated": stats(6, 4.0)},
        },
    )
    own = error_label(t, "memory", PYTHIA_160M, "allocated")
    assert own.own and own.kind == "allocated" and own.long.startswith("memory (allocated figure) ±4% median")
    smi = error_label(t, "memory", PYTHIA_160M)  # suite-predict's GiB/GPU: the nvidia-smi kind
    assert smi.kind == "nvidia-smi" and smi.source is None and smi.short == "±19% (n=25, all regimes)"
    assert smi.long == (
        f"memory (nvidia-smi figure): not scored in {mine.text} (n=2 < {MIN_N}); every regime: "
        "±19% median, 31% p90, n=25 published runs"
    )
    nothing = error_label(t, "memory", PYTHIA_160M, "reserved")
    assert not nothing.scored and nothing.cell == "±?" and "not scored" in nothing.long
    with pytest.raises(ValueError, match="memory_kind"):
        error_label(t, "memory", PYTHIA_160M, "resident")


def test_the_suites_own_gpu_trials_come_before_published_runs(accuracy):
    t = rtx3090("hardware.count=1")
    mine = regime(t, PYTHIA_160M)
    accuracy("cuda-published", {"by_regime": {mine.key: entry(30, 12.0)}})
    accuracy("cuda", {"by_regime": {mine.key: entry(8, 5.0)}})
    label = error_label(t, "step", PYTHIA_160M)
    assert label.own and label.median_pct == 5.0 and "n=8 GPU trials of the suite" in label.long
    accuracy("cuda", {"by_regime": {mine.key: entry(3, 5.0)}})  # too few: the published runs'
    assert error_label(t, "step", PYTHIA_160M).median_pct == 12.0


def test_nothing_scored_says_so_and_a_cpu_prediction_keeps_its_one_regime(accuracy):
    t = rtx3090("hardware.count=1")
    label = error_label(t, "step", PYTHIA_160M)
    assert not label.scored and label.short == "±? (not scored)" and "not scored in consumer-workstation" in label.long
    cpu = trial(["model=pythia-14m", "hardware=cpu-x2"])
    assert "CPU workers of this machine (n=0 < 5)" in error_label(cpu, "step", 0).long
    accuracy("cpu", {"step_time_err_pct": stats(40, 7.6, 18.7), "fit_right_pct": 95.1, "fit_n": 144})
    label = error_label(cpu, "step", 0)
    assert label.own and label.long == "step time ±8% median, 19% p90, n=40 CPU trials in CPU workers of this machine"
    assert "right in 95% of 144 CPU trials (published before the two ways were counted apart)" in fit_label(cpu, 0).text


def test_fit_is_counted_each_way_apart(accuracy):
    assert fit_counts([True, False, True, False], [True, True, False, False]) == {
        "ran": 2,
        "false_no_fit": 1,
        "oom": 2,
        "false_fit": 1,
    }
    t = rtx3090("hardware.count=1")
    mine = regime(t, PYTHIA_160M)
    published = {"ran": 16, "false_no_fit": 1, "oom": 0, "false_fit": 0}
    accuracy("cuda-published", {"by_regime": {mine.levels()[3].key: entry(16, 9.0, fit=published)}})
    text = fit_label(t, PYTHIA_160M).text
    assert text == (
        'false "does not fit" on runs that ran: 1 of 16 published runs in consumer-workstation · 1 GPU; '
        'false "fits" on OOMs: not scored (fewer than 5)'
    )


def test_suite_accuracy_reports_false_fits_and_false_ooms_apart():
    from analysis import accuracy

    key = "datacenter-sxm|zero3|none|1|<1B"
    rows = [
        # ok, predicted to fit; ok, predicted not to (false "does not fit"); OOMs, one predicted to fit (false "fits")
        ("ok", True, 5.0),
        ("ok", False, 7.0),
        ("oom", True, None),
        ("oom", False, None),
    ]
    df = pd.DataFrame(
        [
            {
                "trial_id": f"t{i}",
                "model": "m",
                "budget": "h200-x1",
                "method": "ZeRO-3",
                "outcome": outcome,
                "note": "",
                "pred_fits": fits,
                "fit_right": fits == (outcome == "ok"),
                "step_time_err_pct": err,
                "peak_mem_err_pct": err,
                "step_time_s": 1.0 if err else None,
                "pred_step_time_s": 1.0 if err else None,
                "regime": key,
                "sharding": "ZeRO-3",
                "memory_gib": 141.0,
                "capped": False,
            }
            for i, (outcome, fits, err) in enumerate(rows)
        ]
    )
    s = accuracy.summary(df)
    assert s["fit"] == {"ran": 2, "false_no_fit": 1, "oom": 2, "false_fit": 1} and s["fit_right_pct"] == 50.0
    assert set(s["by_regime"]) == {x.key for x in Regime.from_key(key).levels()}
    own = s["by_regime"][key]
    assert own["n"] == 4 and own["step_time_err_pct"]["n"] == 2 and own["fit"] == s["fit"]
    assert own["memory_err_pct_by_kind"]["allocated"]["median"] == 6.0
    assert s["per_memory"]["141 GiB"]["fit"] == s["fit"]
    text = accuracy.as_text(s, "cuda")
    assert 'false "fits": 1 of 2 OOM trials; false "does not fit": 1 of 2 trials that ran' in text
    assert 'within 141 GiB: false "fits" 1 of 2 OOMs, false "does not fit" 1 of 2 that ran' in text
    assert "datacenter-sxm · ZeRO-3 · no offload · 1 GPU · <1B: step 6.0" in text


def scored(i: int, gpu_cls: str, fits: bool, err: float, kind: str = "nvidia-smi") -> dict:
    return {
        "id": f"r{i}",
        "group": "g",
        "source": "s",
        "gpu": "rtx-3090",
        "gpus": 1,
        "tps_err_pct": err,
        "ratio": 1 + err / 100,
        "predicted_mfu": 0.4,
        "measured_mfu": None,
        "mem_err_pct": err,
        "mem_kind": kind,
        "fits": fits,
        "predicted_tps": 1.0,
        "measured_tps": 1.0,
        "regime": {"gpu_class": gpu_cls, "engine": "ddp", "offload": "none", "gpus": "1", "size": "<1B"},
    }


def test_the_published_score_carries_every_regime_level_and_the_false_does_not_fit():
    from analysis import published_runs as pa

    recs = [scored(i, "consumer-workstation", i != 0, 10.0 + i) for i in range(6)]
    recs += [scored(9, "datacenter-sxm", True, -20.0, "allocated")]
    s = pa.score(recs)
    key = "consumer-workstation|ddp|none|1|<1B"
    assert set(s["by_regime"]) >= {x.key for x in Regime.from_key(key).levels()}
    mine = s["by_regime"][key]
    assert mine["n"] == 6 and mine["fit"] == {"ran": 6, "false_no_fit": 1, "oom": 0, "false_fit": 0}
    assert mine["fit_false_no_pct"] == pytest.approx(100 / 6) and "fit_right_pct" not in mine
    assert set(mine["memory_err_pct_by_kind"]) == {"nvidia-smi"}
    assert s["overall"]["memory_err_pct_by_kind"]["allocated"]["n"] == 1
    seconds = [100 * (1 - 1 / (1 + e / 100)) for e in (12.0, 13.0)]  # step = tokens / (tokens/s)
    assert mine["step_time_err_pct"]["median"] == pytest.approx(sum(seconds) / 2)
    assert set(s["by_gpu_class"]) == {"consumer-workstation", "datacenter-sxm"}
    assert "consumer-workstation · DDP · 1 GPU · <1B" in s["by_class_engine_gpus_size"]
    assert "predicted not to fit 1 of 6 (all ran)" in pa.as_text(s | {"skipped": [], "worst": []})


def test_a_published_score_is_what_the_labels_and_the_sustained_fraction_read(tmp_path, monkeypatch):
    """`publish` writes by_regime, the kinds' memory figures and fit each way apart, which the labels
    read; and `sustained_fitted`, which the GPU model reads its sustained fraction from."""
    from analysis import published_runs as pa
    from suite.predict.gpu import fitted_sustained

    recs = [scored(i, "consumer-workstation", True, 10.0 + i) for i in range(6)]
    recs += [scored(9 + i, "datacenter-sxm", i != 0, -20.0, "allocated") for i in range(5)]
    s = pa.score(recs) | {"sustained_fitted": {"(all groups)": {"consumer": 0.62}, "g": {"consumer": 0.6}}}
    path = pa.publish(s, recs, tmp_path / "cuda-published.json")
    monkeypatch.setattr("suite.paths.accuracy_dir", lambda: tmp_path)
    published = json.loads(path.read_text())
    assert published["fit"] == {"ran": 11, "false_no_fit": 1, "oom": 0, "false_fit": 0}
    assert "fit_right_pct" not in published and published["n_records"] == 11
    for e in published["by_regime"].values():
        assert {"step_time_err_pct", "memory_err_pct_by_kind", "fit"} <= set(e)
    assert fitted_sustained()["consumer"][0] == 0.62
    t = rtx3090("hardware.count=1")
    label = error_label(t, "step", PYTHIA_160M)
    assert label.own and label.n == 6 and label.regime.text in label.long and "n=6 published runs" in label.long
    memory = error_label(t, "memory", PYTHIA_160M)  # nvidia-smi figures, all consumer
    assert memory.own and memory.kind == "nvidia-smi" and memory.n == 6
    assert not error_label(t, "memory", PYTHIA_160M, "allocated").own  # the only allocated ones are datacenter
    sxm = replace(t, hardware=trial(["model=pythia-160m", "hardware=h100-sxm"]).hardware)
    fit = fit_label(sxm, PYTHIA_160M).text
    assert fit.startswith('false "does not fit" on runs that ran: 1 of 5 published runs in datacenter-sxm · DDP')


def test_suite_predict_prints_each_rows_regime_label_with_its_n(accuracy, capsys, tmp_path, monkeypatch):
    """Every row of suite-predict carries a tag; the legend under the table names each tag's regime
    and its labels with their n, or says the regime is not scored."""
    from cli import predict
    from tests.conftest import TINY

    monkeypatch.setattr(predict, "OUT_DIR", tmp_path)
    consumer = {"consumer-workstation|*|*|*|*": entry(9, 15.0, fit={"ran": 9, "false_no_fit": 0, "oom": 0})}
    accuracy("cuda-published", {"by_regime": consumer, "memory_err_pct_by_kind": {"nvidia-smi": stats(25, 19.0)}})
    model = [o for o in TINY if o.startswith("model")]
    space = ["search.engines=[deepspeed]", "search.zero_stages=[0,3]", "search.recomputes=[none]"]
    assert predict.main([*model, "hardware=rtx-3090", "hardware.count=2", *space]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"\s+\d+  ", line)]
    tags = {line.split()[-1] for line in rows}
    assert rows and all(" ±15%* " in r and " ±19%* " in r for r in rows), rows
    legend = out[out.index("error labels by regime") :].splitlines()
    for tag in tags:
        head = next(i for i, line in enumerate(legend) if line.split()[:1] == [tag])
        regime_text, step, memory, fit = (line.strip() for line in legend[head : head + 4])
        assert regime_text.startswith(f"{tag}  consumer-workstation · ") and "2-8 GPUs" in regime_text
        assert step.startswith("step time: not scored in consumer-workstation")
        assert "nearest regime consumer-workstation: ±15% median, 30% p90, n=9 published runs" in step
        assert "every regime: ±19% median, 38% p90, n=25 published runs" in memory
        assert fit.startswith('fit: false "does not fit" on runs that ran: 0 of 9 published runs')
    csv = pd.read_csv(tmp_path / "pythia-14m-rtx-3090-x2.csv")
    assert csv["time_error"].str.contains("n=9 published runs").all() and csv["regime"].notna().all()

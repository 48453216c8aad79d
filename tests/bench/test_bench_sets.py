"""The benchmark's model sets, its numba variants, its first-run probes and its per-model report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import benchmark, combine, firstrun, report, variants
from bench.models import LIGHT, REAL, build, models, random_feeds


def _row(model, batch, ratio, **extra):
    return {"model": model, "batch": batch, "minfer_ms": 2.0 * ratio, "ort_ms": 2.0, "minfer_over_ort": ratio, **extra}


def test_models_selects_by_name_and_group_and_refuses_unknown_names():
    """--models takes names and the groups light/real, keeps the benchmark's order, and names what exists on a typo."""
    assert models(["real", "resnet50"]) == ["resnet50", *[n for n in REAL if n in models()]]
    assert models(["light"]) == list(LIGHT)
    with pytest.raises(SystemExit, match="unknown benchmark model.*mobilenet_v9.*known are .*mobilenet_v3_small"):
        models(["mobilenet_v9"])


def test_real_models_build_at_any_batch_with_feeds_for_their_inputs():
    """A real model built at batch 8 takes batch-8 feeds (the encoder: a 128-long sequence and an int64 mask) in onnxruntime."""
    from modelkit import ort_run

    for name, shape in (("detector", (8, 3, 64, 64)), ("encoder", (8, 128, 64))):
        model = build(name, 8)
        feeds = random_feeds(model)
        assert next(iter(feeds.values())).shape == shape
        out = ort_run(model, feeds)[0]
        assert out.shape[0] == 8 and np.isfinite(out).all()
    mask = random_feeds(build("encoder", 2))["attention_mask"]
    assert mask.dtype == np.int64 and set(np.unique(mask)) == {0, 1} and (mask[:, 0] == 1).all()


def test_the_allow_list_without_numba_keeps_every_other_plugin():
    """The fresh processes' MINFER_PLUGINS names every installed plugin but the numba one, within a list the user set."""
    names = variants.allow_list_without_numba().split(",")
    assert "ops_conv" in names and "ops_basic" in names and "ops_numba" not in names
    assert variants.allow_list_without_numba("ops_basic, ops_numba,minfer-ops-numba,ops_conv") == "ops_basic,ops_conv"
    assert variants.env_without_numba({"PATH": "/bin"})["PATH"] == "/bin"


def test_the_registry_without_numba_holds_every_other_plugin(monkeypatch):
    """The in-process variant's registry lacks the numba plugin, the default one keeps it, and MINFER_PLUGINS is left as it was."""
    import minfer_core

    if not variants.numba_installed():
        pytest.skip("minfer-ops-numba is not installed")
    monkeypatch.delenv(variants.ALLOW_ENV, raising=False)
    default = set(variants.plugin_names(minfer_core.get_registry()))
    without = set(variants.plugin_names(variants.registry_without_numba()))
    assert default - without == {variants.NUMBA_DIST}
    assert variants.ALLOW_ENV not in __import__("os").environ


def test_cold_and_warm_first_runs_share_one_fresh_cache(monkeypatch):
    """The warm probe runs in a second process over the cold one's cache directories, which are new (never the user's)."""
    calls = []

    def fake(engine, name, batch, threads, env):
        calls.append({k: env[k] for k in ("MINFER_CACHE", "NUMBA_CACHE_DIR", "XDG_CACHE_HOME")})
        return {"first_ms": 10.0 * len(calls), "build_s": 1.0}

    monkeypatch.setattr(firstrun, "_probe_process", fake)
    got = firstrun.first_runs("minfer", "detector", 1, 2, {"MINFER_CACHE": "/home/user/.cache/minfer"})
    assert len(calls) == 2 and calls[0] == calls[1]
    assert calls[0]["MINFER_CACHE"] != "/home/user/.cache/minfer" and calls[0]["NUMBA_CACHE_DIR"].startswith(calls[0]["MINFER_CACHE"])
    assert got["first_ms"] == 10.0 and got["warm_first_ms"] == 20.0
    calls.clear()
    assert "warm_first_ms" not in firstrun.first_runs("onnxruntime", "detector", 1)
    assert len(calls) == 1


def test_a_first_run_probe_times_build_and_runs_of_a_fresh_session():
    """One probe (in this process here) reports import, build, first and second run, and a second session's first run."""
    got = firstrun.probe("onnxruntime", "detector", 1)
    for key in ("import_s", "build_s", "first_ms", "second_ms", "second_session_build_s", "second_session_first_ms"):
        assert got[key] >= 0, key


def test_per_model_table_gives_each_batch_and_the_geo_mean_of_each_set():
    """One row per model with a b1, b8 cell per ratio, geo-means over the light and the real models, and no column no row has."""
    rows = [_row("resnet50", 1, 2.0, first_cold_over_median=50.0), _row("resnet50", 8, 1.5),
            _row("squeezenet", 1, 8.0), _row("squeezenet", 8, 1.5),
            _row("mobilenet_v3_small", 1, 3.0, nonumba_over_ort=4.0), _row("mobilenet_v3_small", 8, 2.0, nonumba_over_ort=3.0)]
    summary = report.summarize(rows, [1, 8])
    assert summary["sets"]["light"]["b1"]["minfer_over_ort"] == pytest.approx(4.0)
    assert summary["sets"]["real"]["b8"]["nonumba_over_ort"] == pytest.approx(3.0)
    assert summary["b1"]["geomean_minfer_over_ort"] == pytest.approx(4.0) and summary["b1"]["models"] == 2
    table = report.per_model_table(rows, summary)
    assert table[0] == ("| model | set | minfer/ORT | minfer/ORT without numba | first run / median, cold |")
    assert "| squeezenet | light | 8.00, 1.50 | -, - | -, - |" in table
    assert "| mobilenet_v3_small | real | 3.00, 2.00 | 4.00, 3.00 | -, - |" in table
    assert "| **geo-mean light** | | 4.00, 1.50 | -, - | 50.00, - |" in table
    assert "| **geo-mean real** | | 3.00, 2.00 | 4.00, 3.00 | -, - |" in table


def test_combine_reads_the_first_table_of_a_run_and_the_new_ratios(tmp_path, capsys):
    """A run's Markdown ends with the per-model table: combine reads the full table only; from JSON it takes the new ratios too."""
    rows = [_row("resnet50", 1, 2.0, first_cold_over_median=40.0, peak_over_ort=0.8), _row("mobilenet_v2", 1, 3.0)]
    text = benchmark.markdown(rows, report.summarize(rows, [1]), None, "SkylakeX")
    md = tmp_path / "run.md"
    md.write_text(text)
    assert [r["model"] for r in combine.load(str(md))] == ["resnet50", "mobilenet_v2"]
    runs = []
    for i, numba in enumerate(("both", "with")):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps({"rows": rows, "settings": {"openblas_coretype": "SkylakeX", "numba": numba}}))
        runs.append(str(path))
    assert combine.main(runs) == 0
    out = capsys.readouterr().out
    assert "| resnet50 | 1 | 4.0 | 2.0 | 2.00 | 2.00-2.00 | - | - | 40.00 | 0.80 |" in out
    assert "over 1 light models 2.00" in out and "over 1 real models 3.00" in out


def test_combine_refuses_runs_with_and_without_numba(tmp_path, capsys):
    """A run whose minfer ran without the numba plugin is another engine: combine will not take medians across the two."""
    runs = []
    for numba in ("with", "without"):
        path = tmp_path / f"{numba}.json"
        path.write_text(json.dumps({"rows": [_row("resnet50", 1, 2.0)], "settings": {"numba": numba}}))
        runs.append(str(path))
    assert combine.main(runs) == 2
    assert "different numba settings (with numba, without numba)" in capsys.readouterr().err


def test_variants_select_measures_minfer_with_and_without_numba():
    """--numba both runs minfer as installed and from a registry without the plugin; without: that registry alone."""
    if not variants.numba_installed():
        pytest.skip("minfer-ops-numba is not installed")
    both, without = variants.select("both"), variants.select("without")
    assert set(both["registries"]) == {"minfer", "minfer_nonumba"} and both["registries"]["minfer"] is None
    assert variants.NUMBA_DIST in both["plugins"]["minfer"] and variants.NUMBA_DIST not in both["plugins"]["minfer_nonumba"]
    assert set(without["registries"]) == {"minfer"} and variants.NUMBA_DIST not in without["plugins"]["minfer"]
    assert "ops_numba" not in without["envs"]["minfer"][variants.ALLOW_ENV]


def test_a_short_run_measures_every_variant_in_its_own_cache_and_leaves_the_environment(monkeypatch, tmp_path):
    """A run of one model fills the row of each variant (median, runs 2..N, agreement with onnxruntime) and restores MINFER_CACHE."""
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(benchmark, "PAUSE", 0.0)
    result = benchmark.run_benchmark(["detector"], [1], repeat=2, rounds=1, ref=False, memory=False, overhead=False,
                                     first_run=False, numba="both")
    (row,) = result["rows"]
    keys = ["minfer_ms", "ort_ms", "later_max_over_median", "ort_later_max_over_median"]
    if variants.numba_installed():
        keys += ["minfer_nonumba_ms", "nonumba_over_ort", "nonumba_later_max_over_median"]
        assert row["nonumba_max_rel_err"] < 1e-4
    for key in keys:
        assert row[key] > 0, key
    assert row["later_max_over_median"] >= 1.0 and row["max_rel_err"] < 1e-4
    assert result["settings"]["minfer_cache"] == "new and empty"
    assert __import__("os").environ["MINFER_CACHE"] == str(tmp_path) and list(tmp_path.iterdir()) == []
    assert "| detector | real |" in benchmark.markdown(result["rows"], result["summary"], None)


def test_kernel_ab_compares_with_and_without_a_pass(capsys):
    """``--without-pass``: the second session is built without that pass (here the detector's Swish fusion), every
    kernel installed; naming neither a kernel nor a pass, or both, is a usage error."""
    from bench import kernel_ab

    row = kernel_ab.compare(None, "detector", 1, 1, 1, without_pass="activation_fusion")
    assert row["pass"] == "activation_fusion" and "kernel" not in row
    assert row["with"] > 0 and row["without"] > 0
    for argv in (["--models", "detector"], ["some:kernel", "--without-pass", "x", "--models", "detector"]):
        with pytest.raises(SystemExit):
            kernel_ab.main(argv)
    assert "one of the two" in capsys.readouterr().err

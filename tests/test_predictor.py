"""The predictor (omnitune.predict, omnitune/runtime/_predictor.py): its fit from stored trials and
its JSON round trip, leave-one-out on a stored synthetic sweep whose best config follows one
dimension in a known way, the predictor rung of the lookup chain (valid configs only, cached), and
corrupt predictor blocks falling through like any bad entry."""

from __future__ import annotations

import dataclasses
import json
import logging
import random

import pytest
import torch
from typer.testing import CliRunner

import omnitune.runtime as runtime
from omnitune import export, predict
from omnitune.cli import app
from omnitune.kernels.kv_cache_write import SPEC, KVCacheWriteProblem
from omnitune.predict._fit import block_of, measured_problems, point_of
from omnitune.runtime import Rung
from omnitune.runtime import _chain
from omnitune.runtime._predictor import KIND, MAX_CONFIGS_PER_POINT, MAX_NEIGHBOURS, parse_label, parse_predictor
from omnitune.spec import Config
from predictor_sweep import FP16, TOKENS, best_block_t, problem, sweep_rows, synthetic_ms, true_best
from trial_rows import H200, results_db

@pytest.fixture(scope="module")
def sweep_db(tmp_path_factory):
    return results_db(tmp_path_factory.mktemp("sweep") / "results.db", sweep_rows())


def trials(db):
    from omnitune import store

    return store.read_trials(db, "kv_cache_write")


# --- the fit and its JSON -------------------------------------------------------------------------


def test_the_fit_keeps_every_ok_search_trial_as_a_time_ratio(sweep_db):
    block = predict.fit_block(SPEC, trials(sweep_db), keep=1000)
    assert block["kind"] == KIND and block["neighbours"] == predict.NEIGHBOURS
    assert block["features"] == ["t", "hkv", "d", "block_size", "flops_per_byte"]
    assert block["match"] == ["cache_dtype"]
    assert sorted(block["points"]) == sorted(f"fp16|{SPEC.problem_key(problem(t))}" for t in TOKENS)
    for t in TOKENS:
        p = problem(t)
        point = block["points"][f"fp16|{SPEC.problem_key(p)}"]
        assert point["dtype"] == "fp16" and point["problem"] == dataclasses.asdict(p)
        ratios = point["time_ratios"]
        valid = SPEC.valid_configs(p, FP16)
        assert len(ratios) == len(valid)  # every valid config; not the mismatch's fast time
        best = true_best(p)
        assert ratios[best.label()] == 1.0  # the re-timing (10x slower) did not replace it
        for config in valid:
            assert ratios[config.label()] == round(synthetic_ms(p, config) / synthetic_ms(p, best), 4)


def test_keep_limits_each_point_to_its_fastest_configs(sweep_db):
    block = predict.fit_block(SPEC, trials(sweep_db), keep=5)
    for point in block["points"].values():
        assert len(point["time_ratios"]) == 5 and min(point["time_ratios"].values()) == 1.0


def test_the_block_round_trips_through_json_and_the_runtime_parser(sweep_db):
    block = predict.fit_block(SPEC, trials(sweep_db))
    text = export.document_text(block)
    assert text == export.document_text(predict.fit_block(SPEC, trials(sweep_db)))  # deterministic
    parsed, bad, total = parse_predictor(json.loads(text), SPEC)
    assert bad == [] and total == len(TOKENS) == len(parsed.points)
    for point in parsed.points:
        raw = block["points"][point.key]
        assert {c.label(): r for c, r in point.ratios.items()} == raw["time_ratios"]
        assert point.problem == SPEC.problem_from_mapping(raw["problem"])


def test_a_label_is_read_only_as_omnitune_writes_it():
    config = Config(BLOCK_H=4, BLOCK_T=16, num_warps=2)
    assert parse_label(SPEC, config.label()) == config
    for bad in ("BLOCK_H=4 BLOCK_T=16", "BLOCK_H=4 BLOCK_T=+16 num_warps=2", "BLOCK_T=16 BLOCK_H=4 num_warps=2",
                "BLOCK_H=4 BLOCK_T=3 num_warps=2", "BLOCK_H=4 BLOCK_T=16 NOPE=1 num_warps=2",
                "BLOCK_H=4 BLOCK_T=16.0 num_warps=2", "BLOCK_H=4  BLOCK_T=16 num_warps=2", ""):
        with pytest.raises(Exception):
            parse_label(SPEC, bad)


def test_a_flag_in_a_label_is_0_or_1():
    from omnitune.kernels.attention import SPEC as ATTENTION

    for tma in (False, True):
        config = ATTENTION.default_config(ATTENTION.example_problem, FP16).replace(USE_TMA=tma)
        assert parse_label(ATTENTION, config.label()) == config
        flag = f"USE_TMA={int(tma)}"
        assert flag in config.label()
        with pytest.raises(Exception):
            parse_label(ATTENTION, config.label().replace(flag, f"USE_TMA={str(tma).lower()}"))


# --- leave one problem out ------------------------------------------------------------------------


def test_leave_one_out_recovers_the_known_structure(sweep_db):
    held = {h.problem_key: h for h in predict.leave_one_out(sweep_db, "kv_cache_write")}
    assert len(held) == len(TOKENS)
    for t in TOKENS:
        h = held[SPEC.problem_key(problem(t))]
        assert h.kernel == "kv_cache_write" and h.device_key == "NVIDIA_H200" and h.dtype == "fp16"
        assert h.ratio == pytest.approx(synthetic_ms(problem(t), parse_label(SPEC, h.config))
                                        / synthetic_ms(problem(t), true_best(problem(t))))
        assert h.default_ratio == pytest.approx(synthetic_ms(problem(t), SPEC.default_config(problem(t), FP16))
                                                / synthetic_ms(problem(t), true_best(problem(t))))
        assert len(h.neighbours) == 3 and SPEC.problem_key(problem(t)) not in " ".join(h.neighbours)
        if t not in (TOKENS[0], TOKENS[-1]):  # between two tuned problems: the best itself
            assert h.rung == "predictor" and h.config == true_best(problem(t)).label() and h.ratio == 1.0
        else:  # beyond the last one: one octave of BLOCK_T off at most
            assert h.ratio <= 1.3 + 1e-9
    totals = predict.summary(list(held.values()))
    assert totals["problems"] == len(TOKENS) and totals["predicted"]["measured"] == len(TOKENS)
    assert totals["predicted_best"] >= len(TOKENS) - 2
    paired = totals["paired_with_default"]
    assert paired["problems"] == len(TOKENS) and paired["predicted_geomean"] < paired["default_geomean"]
    # Every problem here is within 4x of two others: the nearest rung would lend a neighbour's winner.
    assert totals["nearest"]["measured"] == len(TOKENS) and totals["nearest"]["geomean_ratio"] > 1.0


def test_leave_one_out_of_a_lone_problem_answers_the_default(tmp_path):
    db = results_db(tmp_path / "one.db", sweep_rows(tokens=(256,)))
    (held,) = predict.leave_one_out(db, "kv_cache_write")
    assert held.rung == "default" and held.neighbours == () and held.config == SPEC.default_config(problem(256), FP16).label()
    assert held.ratio == held.default_ratio and held.nearest_key is None


# --- the predictor rung of the chain --------------------------------------------------------------


@pytest.fixture
def exported(sweep_db, tables_dir):
    export.export_tables(sweep_db, tables_dir)
    return tables_dir / "kv_cache_write" / "NVIDIA_H200.json"


@pytest.fixture
def warnings_seen(caplog):
    caplog.set_level(logging.WARNING, logger="omnitune.runtime")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "omnitune.runtime" and r.levelno >= logging.WARNING]


def test_export_writes_the_block_and_a_far_problem_is_predicted(exported, warnings_seen):
    doc = json.loads(exported.read_text())
    assert sorted(doc["predictor"]["points"]) == sorted(doc["entries"])
    # hkv=8: an exact field of the MatchPolicy, so no entry is near; the predictor is.
    far = problem(1024, hkv=8)
    answer = runtime.lookup("kv_cache_write", far, FP16, H200)
    assert answer.rung is Rung.PREDICTOR and answer.rung == "predictor"
    assert answer.config["BLOCK_T"] == best_block_t(1024) and not SPEC.violations(far, answer.config, FP16)
    assert answer.source == exported and answer.matched_key == f"fp16|{SPEC.problem_key(problem(1024))}"
    assert answer.distance == pytest.approx(1.0)  # one octave of hkv
    assert len(answer.neighbours) == 3 and answer.neighbours[0] == answer.matched_key
    assert 1.0 <= answer.expected_ratio < 1.3
    assert warnings_seen() == []


def test_export_without_the_predictor_removes_the_block_and_the_default_answers(exported, sweep_db):
    # The command line, for real, over the file the fixture wrote with a block: --no-predictor
    # drops that block and keeps every entry; the far problem the predictor answered then gets
    # the kernel's untuned answer. Exporting again without the flag fits the block again.
    before = json.loads(exported.read_text())
    far = problem(1024, hkv=8)
    assert runtime.lookup("kv_cache_write", far, FP16, H200).rung is Rung.PREDICTOR
    result = CliRunner().invoke(app, ["export", "--db", str(sweep_db), "--out", str(exported.parents[1]), "--no-predictor"])
    assert result.exit_code == 0, result.output
    after = json.loads(exported.read_text())
    assert "predictor" not in after and after["entries"] == before["entries"]
    runtime.clear_cache()
    answer = runtime.lookup("kv_cache_write", far, FP16, H200)
    assert answer.rung is Rung.DEFAULT and answer.config == SPEC.untuned_answer(far, FP16)
    result = CliRunner().invoke(app, ["export", "--db", str(sweep_db), "--out", str(exported.parents[1])])
    assert result.exit_code == 0, result.output
    assert json.loads(exported.read_text())["predictor"] == before["predictor"]


def test_a_far_bf16_problem_is_predicted_from_the_fp16_points(exported):
    # The sweep tuned fp16 only: a bf16 call with no entry near borrows fp16's predictor points,
    # and says so; the config still meets every constraint in bf16.
    far = problem(1024, hkv=8)
    answer = runtime.lookup("kv_cache_write", far, torch.bfloat16, H200)
    assert answer.rung is Rung.PREDICTOR and answer.matched_key.startswith("fp16|")
    assert answer.config["BLOCK_T"] == best_block_t(1024) and not SPEC.violations(far, answer.config, torch.bfloat16)
    why = runtime.explain("kv_cache_write", far, torch.bfloat16, H200).why
    assert "nearest fp16 tuned shapes" in why and "tables hold no bf16 entry" in why


def test_the_nearest_rung_comes_before_the_predictor(exported):
    near = problem(1536)  # within 4x of tuned problems of the same hkv
    assert runtime.lookup("kv_cache_write", near, FP16, H200).rung is Rung.NEAREST
    assert runtime.lookup("kv_cache_write", problem(1024), FP16, H200).rung is Rung.EXACT


def test_predicted_answers_are_cached_and_cleared(exported, monkeypatch):
    calls = []
    real = _chain.predict_with
    monkeypatch.setattr(_chain, "predict_with", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    first = runtime.lookup("kv_cache_write", problem(1024, hkv=8), FP16, H200)
    again = runtime.lookup("kv_cache_write", problem(1000, hkv=8), FP16, H200)  # the same bucket
    assert again is first and len(calls) == 1
    runtime.clear_cache()
    assert runtime.lookup("kv_cache_write", problem(1024, hkv=8), FP16, H200) == first and len(calls) == 2


def test_a_predicted_config_never_breaks_a_constraint_or_leaves_the_space(exported):
    rng = random.Random(0)
    rungs = set()
    for _ in range(300):
        p = KVCacheWriteProblem(t=rng.randint(1, 70_000), hkv=rng.choice((1, 2, 3, 8, 16, 40)), d=rng.choice((64, 128, 256)),
                                block_size=rng.choice((8, 16, 32)))
        answer = runtime.lookup("kv_cache_write", p, FP16, H200)
        rungs.add(answer.rung)
        assert SPEC.coerce_config(answer.config.as_dict(), strict=True) == answer.config
        assert SPEC.violations(p, answer.config, FP16) == [], (p, answer)
    assert Rung.PREDICTOR in rungs


def _constrained_point(with_own_default: bool) -> dict:
    """One point whose fastest config has 64-token blocks, which a 2-token problem cannot take;
    with_own_default: it measured its own default config too, at 2.5x its best."""
    big = Config(BLOCK_H=4, BLOCK_T=64, num_warps=8)
    small = Config(BLOCK_H=1, BLOCK_T=2, num_warps=1)
    ratios = {big.label(): 1.0, small.label(): 1.1, Config(BLOCK_H=1, BLOCK_T=1, num_warps=1).label(): 4.0,
              Config(BLOCK_H=2, BLOCK_T=1, num_warps=1).label(): 3.0}
    if with_own_default:
        ratios[SPEC.default_config(problem(4096), FP16).label()] = 2.5
    return {"dtype": "fp16", "problem": dataclasses.asdict(problem(4096)), "time_ratios": ratios}


def test_the_predictor_skips_a_candidate_that_breaks_a_constraint_of_the_problem(tables_dir):
    # The tiny problem's default was not measured there; the point's own default ran at 2.5x its
    # best, which is what the default is expected to cost here.
    _write(tables_dir, {f"fp16|{SPEC.problem_key(problem(4096))}": _constrained_point(with_own_default=True)})
    tiny = problem(2, hkv=8)
    assert SPEC.violations(tiny, Config(BLOCK_H=4, BLOCK_T=64, num_warps=8), FP16)
    answer = runtime.lookup("kv_cache_write", tiny, FP16, H200)
    assert answer.rung is Rung.PREDICTOR and answer.config == Config(BLOCK_H=1, BLOCK_T=2, num_warps=1)


def test_the_default_answers_where_no_neighbour_measured_a_default(tables_dir):
    # Neither this problem's default nor the point's own: nothing says a prediction beats it (a
    # default rule changed since the point was searched is the case this guards).
    _write(tables_dir, {f"fp16|{SPEC.problem_key(problem(4096))}": _constrained_point(with_own_default=False)})
    tiny = problem(2, hkv=8)
    answer = runtime.lookup("kv_cache_write", tiny, FP16, H200)
    assert answer.rung is Rung.DEFAULT and answer.config == SPEC.default_config(tiny, FP16)
    assert "measured this problem's default config or their own" in runtime.explain("kv_cache_write", tiny, FP16, H200).why


def test_the_default_answers_when_no_candidate_is_expected_to_beat_it(tables_dir):
    p = problem(1024, hkv=8)
    default = SPEC.default_config(p, FP16)
    other = Config(BLOCK_H=1, BLOCK_T=1, num_warps=1)
    point = {"dtype": "fp16", "problem": dataclasses.asdict(problem(1024)),
             "time_ratios": {default.label(): 1.0, other.label(): 2.0}}
    _write(tables_dir, {f"fp16|{SPEC.problem_key(problem(1024))}": point})
    answer = runtime.lookup("kv_cache_write", p, FP16, H200)
    assert answer.rung is Rung.DEFAULT and answer.config == default
    assert "expected to beat the default config" in runtime.explain("kv_cache_write", p, FP16, H200).why


def test_a_table_without_the_block_reads_as_before(tables_dir):
    _write(tables_dir, None)
    answer = runtime.lookup("kv_cache_write", problem(1024, hkv=8), FP16, H200)
    assert answer.rung is Rung.DEFAULT and answer.neighbours == () and answer.expected_ratio is None
    assert runtime.lookup("kv_cache_write", problem(1024), FP16, H200).rung is Rung.EXACT
    assert runtime.explain("kv_cache_write", problem(1024, hkv=8), FP16, H200).why.endswith("the tables hold no predictor block")


# --- corrupt blocks -------------------------------------------------------------------------------


def _good_points():
    rows = sweep_rows(tokens=(512, 1024, 2048))
    import pandas as pd

    return {k: point_of(m) for k, m in measured_problems(SPEC, pd.DataFrame(rows)).items()}


GOOD_POINTS = None


def _block(points=None, **changes):
    global GOOD_POINTS
    if GOOD_POINTS is None:
        GOOD_POINTS = _good_points()
    block = block_of(SPEC, json.loads(json.dumps(points if points is not None else GOOD_POINTS)))
    block.update(changes)
    return block


def _write(tables_dir, points, block=None):
    """A kv_cache_write table for the H200 with one entry (t=1024, hkv=4) and a predictor block of
    `points` (None: no block; `block`: this block as it is)."""
    p = problem(1024)
    entry = {"problem": dataclasses.asdict(p), "dtype": "fp16", "config": true_best(p).as_dict()}
    doc = {"schema_version": 1, "kernel": "kv_cache_write", "device": {"name": H200, "key": "NVIDIA_H200"},
           "entries": {f"fp16|{SPEC.problem_key(p)}": entry}}
    if block is not None:
        doc["predictor"] = block
    elif points is not None:
        doc["predictor"] = _block(points)
    path = tables_dir / "kv_cache_write" / "NVIDIA_H200.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _first_point_changed(change):
    points = json.loads(json.dumps(_block()["points"]))
    key = sorted(points)[0]
    change(points[key])
    return points


def _label_replaced(old, new):
    def change(point):
        label = sorted(point["time_ratios"])[0]
        point["time_ratios"][label.replace(old, new)] = point["time_ratios"].pop(label)
    return change


WHOLE_BLOCK = {
    "not_an_object": lambda: [1, 2, 3],
    "neighbours_a_string": lambda: _block(neighbours="3"),
    "neighbours_a_flag": lambda: _block(neighbours=True),
    "neighbours_zero": lambda: _block(neighbours=0),
    "neighbours_past_the_bound": lambda: _block(neighbours=MAX_NEIGHBOURS + 1),
    "features_unknown": lambda: _block(features=["t", "nope"]),
    "features_not_a_list": lambda: _block(features="t"),
    "features_repeated": lambda: _block(features=["t", "t"]),
    "match_unknown": lambda: _block(match=["flavour"]),
    "points_a_list": lambda: _block(points={}) | {"points": []},
}

BAD_POINT = {
    "nan_ratio": lambda p: p["time_ratios"].update({sorted(p["time_ratios"])[0]: float("nan")}),
    "ratio_below_one": lambda p: p["time_ratios"].update({sorted(p["time_ratios"])[0]: 0.5}),
    "ratio_a_string": lambda p: p["time_ratios"].update({sorted(p["time_ratios"])[0]: "1.0"}),
    "ratio_a_flag": lambda p: p["time_ratios"].update({sorted(p["time_ratios"])[0]: True}),
    "unknown_param": _label_replaced("BLOCK_H=", "BLOCK_Q="),
    "outside_the_space": _label_replaced("BLOCK_T=", "BLOCK_T=3"),
    "flag_spelled_otherwise": _label_replaced("num_warps=", "num_warps=+"),
    "no_ratios": lambda p: p.update(time_ratios={}),
    "ratios_past_the_bound": lambda p: p.update(
        time_ratios={f"BLOCK_T={i}": 1.0 for i in range(MAX_CONFIGS_PER_POINT + 1)}),
    "ratios_a_list": lambda p: p.update(time_ratios=[1.0]),
    "problem_missing": lambda p: p.pop("problem"),
    "problem_impossible": lambda p: p["problem"].update(t=-5),
    "dtype_unknown": lambda p: p.update(dtype="fp8"),
    "key_mismatch": lambda p: p["problem"].update(t=999),
    "not_an_object": lambda p: p.clear(),
}


@pytest.mark.parametrize("kind", sorted(WHOLE_BLOCK))
def test_a_corrupt_block_is_ignored_with_one_warning(tables_dir, warnings_seen, kind):
    _write(tables_dir, None, block=WHOLE_BLOCK[kind]())
    far = problem(1024, hkv=8)
    for t in (1024, 4000, 60000):
        assert runtime.lookup("kv_cache_write", problem(t, hkv=8), FP16, H200).rung is Rung.DEFAULT
    assert runtime.lookup("kv_cache_write", far, FP16, H200).config == SPEC.default_config(far, FP16)
    assert runtime.lookup("kv_cache_write", problem(1024), FP16, H200).rung is Rung.EXACT  # entries unaffected
    seen = warnings_seen()
    assert len(seen) == 1 and "ignoring the predictor block of" in seen[0] and "omnitune export" in seen[0], seen


@pytest.mark.parametrize("kind", sorted(BAD_POINT))
def test_a_bad_point_is_skipped_with_one_warning_and_the_others_predict(tables_dir, warnings_seen, kind):
    points = _first_point_changed(BAD_POINT[kind])
    _write(tables_dir, points)
    for t in (512, 1024, 2048, 3000):
        answer = runtime.lookup("kv_cache_write", problem(t, hkv=8), FP16, H200)
        assert answer.rung is Rung.PREDICTOR and sorted(points)[0] not in answer.neighbours
        assert not SPEC.violations(problem(t, hkv=8), answer.config, FP16)
    seen = warnings_seen()
    assert len(seen) == 1 and "ignoring 1 of the 3 points of the predictor block" in seen[0], seen


def test_a_block_of_another_kind_is_not_read_and_not_warned_about(tables_dir, warnings_seen, caplog):
    caplog.set_level(logging.INFO, logger="omnitune.runtime")
    _write(tables_dir, None, block=_block(kind="decision_tree"))
    assert runtime.lookup("kv_cache_write", problem(1024, hkv=8), FP16, H200).rung is Rung.DEFAULT
    assert warnings_seen() == []
    assert any("not using the predictor block" in r.getMessage() and "decision_tree" in r.getMessage()
               for r in caplog.records)


def test_a_block_is_parsed_once_per_file_version_and_only_when_needed(tables_dir, monkeypatch):
    from omnitune.runtime import _tables

    parses = []
    real = _tables.parse_predictor
    monkeypatch.setattr(_tables, "parse_predictor", lambda *a: parses.append(1) or real(*a))
    _write(tables_dir, _block()["points"])
    runtime.lookup("kv_cache_write", problem(1024), FP16, H200)  # exact: the block is not needed
    assert parses == []
    for t in (512, 1024, 2048, 3000, 60000):
        runtime.lookup("kv_cache_write", problem(t, hkv=8), FP16, H200)
    assert parses == [1]


# --- export merges blocks point by point ----------------------------------------------------------


def test_export_merges_points_and_drops_invalid_ones(tmp_path, caplog):
    out = tmp_path / "tables"
    export.export_tables(results_db(tmp_path / "a.db", sweep_rows(tokens=(64, 128))), out)
    path = out / "kv_cache_write" / "NVIDIA_H200.json"
    doc = json.loads(path.read_text())
    bad_key = f"fp16|{SPEC.problem_key(problem(128))}"
    doc["predictor"]["points"][bad_key]["time_ratios"]["BLOCK_H=4 BLOCK_T=3 num_warps=1"] = 1.0
    path.write_text(json.dumps(doc))
    caplog.set_level(logging.WARNING, logger="omnitune.export")
    (written,) = export.export_tables(results_db(tmp_path / "b.db", sweep_rows(tokens=(1024,))), out)
    merged = json.loads(path.read_text())
    assert sorted(merged["predictor"]["points"]) == sorted(
        f"fp16|{SPEC.problem_key(problem(t))}" for t in (64, 1024))
    assert written.predictor_points == 2 and written.dropped == 1
    assert any("predictor block" in r.getMessage() and bad_key in r.getMessage() for r in caplog.records)
    parsed, bad, _ = parse_predictor(merged["predictor"], SPEC)
    assert bad == [] and len(parsed.points) == 2


def test_an_unreadable_block_in_the_file_is_replaced(tmp_path):
    out = tmp_path / "tables"
    db = results_db(tmp_path / "a.db", sweep_rows(tokens=(64,)))
    export.export_tables(db, out)
    path = out / "kv_cache_write" / "NVIDIA_H200.json"
    doc = json.loads(path.read_text())
    doc["predictor"] = "garbage"
    path.write_text(json.dumps(doc))
    (written,) = export.export_tables(db, out)
    assert written.changed and json.loads(path.read_text())["predictor"]["kind"] == KIND

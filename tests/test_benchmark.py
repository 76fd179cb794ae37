"""Smoke test of benchmarks/aggregation.py on tiny shapes (no timing assertions)."""

import importlib.util
import math
from pathlib import Path
from unittest import mock

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _load(script: str = "aggregation", name: str | None = None):
    """benchmarks/<script>.py loaded as a fresh module (scripts keep module-level settings)."""
    spec = importlib.util.spec_from_file_location(name or f"bench_{script}", ROOT / "benchmarks" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_resnet18_shapes():
    bench = _load()
    shapes = bench.resnet18_shapes()
    assert len(shapes) == 62
    assert sum(int(__import__("math").prod(s)) for s in shapes) == 11_689_512


def test_benchmark_runs_and_reports_ratios():
    bench = _load()
    records = bench.run(shapes=[(8, 3, 3, 3), (8,), (10, 8)], sources=(2, 3), repeats=2)
    forms = {(r["n_sources"], r["form"]) for r in records}
    assert forms == {(n, f) for n in (2, 3) for f in bench.FORMS}
    for r in records:
        assert r["median_ms"] > 0 and r["ratio_to_floor"] > 0
        assert r["max_abs_diff_naive_vs_library"] < 1e-4  # the naive loop and the library agree
    report = bench.format_report(records, bench.environment(bench.resolve_device("cpu")))
    assert "library/floor" in report and "naive/library" in report


def test_federated_benchmark_smoke():
    """benchmarks/federated.py --quick runs the three implementations of the round loop and reports a ratio."""
    mod = _load("federated")
    out = mod.main(["--quick", "--device", "cpu"])
    (res,) = out["results"]
    assert set(res["seconds_per_round"]) == {"library", "library batched", "plain loop"}
    assert res["device"] == "cpu"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_federated_benchmark_compiled_smoke():
    """benchmarks/federated.py --compiled --quick times eager against compiled batched clients per round in a run,
    and the plain loop in the same process."""
    mod = _load("federated", "bench_federated_compiled")
    (res,) = mod.main(["--quick", "--device", "cpu", "--compiled"])["results"]
    assert set(res["seconds_per_round"]) == {"batched (eager)", "batched (compiled)", "plain loop"}
    per_round = res["seconds_per_round"]
    assert per_round["batched (eager)"] > 0 and per_round["batched (compiled)"] > 0 and res["ratio_eager_over_compiled"] > 0
    # the plain loop's time is a difference of two runs: NaN (recorded as such) when set-up noise swamps one round
    assert math.isnan(per_round["plain loop"]) or (
        per_round["plain loop"] > 0
        and res["ratio_plain_over_compiled"] == per_round["plain loop"] / per_round["batched (compiled)"])
    # what compiling costs per process: the first compiled run's warm-up rounds (later runs reuse its graphs)
    # against the eager runs' median, and when it pays
    warm = res["warm_seconds"]
    assert warm["batched (compiled)"] > 0 and warm["batched (eager)"] > 0
    assert res["compile_overhead_s"] == res["compiled_warm_seconds_first"] - warm["batched (eager)"]
    saved = per_round["batched (eager)"] - per_round["batched (compiled)"]
    assert res["break_even_rounds"] == (res["compile_overhead_s"] / saved if saved > 0 else None)


def test_aggregation_regression_script_compares_two_revisions_in_one_process():
    """benchmarks/aggregation_regression.py loads a revision's aggregation.py beside this checkout's; here HEAD's,
    on tiny shapes (the segments form is checked bit for bit against the loaded version's dict form)."""
    import pytest

    mod = _load("aggregation_regression", "bench_regression")
    old = mod.load_revision("HEAD")
    assert old.fedgp is not mod.current.fedgp
    med = mod.measure(old, 3, 2, shapes=[(8, 3, 3, 3), (8,), (10, 8)])
    assert {"old views+out", "new views+out", "new segments+out", "copy floor"} <= set(med)
    assert all(v > 0 for v in med.values())
    with pytest.raises(ValueError, match="--against 'no-such-revision'"):
        mod.load_revision("no-such-revision")


def test_baselines_benchmark_times_the_notebooks_default_settings():
    """benchmarks/baselines.py's settings are notebooks 04's and 07's defaults (their parameters cells), so
    docs/baselines.md § Cost times what the notebooks run."""
    from fda_core.workbook.parameters import default_values

    bench = _load("baselines")
    nb04 = default_values(ROOT / "notebooks" / "04_real_data.ipynb")
    for key in ("rounds", "warmup_rounds", "lr_decay", "model", "source_lr", "target_lr", "target_local_epochs",
                "target_batch_size", "n_target_labeled"):
        assert bench.NB04[key] == nb04[key], key
    assert set(bench.SETTINGS["04"]["ColoredMNIST −90%"][1]) == {"source_only", *nb04["baselines"]}
    nb07 = default_values(ROOT / "notebooks" / "07_auxiliary_tasks.ipynb")
    for key in ("rounds", "model", "source_lr", "target_lr", "n_target_labeled", "target_batch_size", "warmup_rounds"):
        assert bench.NB07[key] == nb07[key], key
    assert {r.lower() for r in nb07["fda_baselines"]} <= set(bench.SETTINGS["07"]["SUPPORT2"][1])


def test_baselines_benchmark_smoke(tmp_path):
    """benchmarks/baselines.py --quick runs every baseline once and reports its ratio to Source only."""
    out = _load("baselines").main(["--quick", "--settings", "07", "--json", str(tmp_path / "b.json")])
    assert set(out) == {"07 DigitConditions", "07 SUPPORT2"}
    for medians in out.values():
        assert set(medians) == {"source_only", "fada", "kd3a"}
        assert medians["source_only"]["ratio_to_source_only"] == 1.0
        assert all(m["seconds"] > 0 for m in medians.values())
    assert (tmp_path / "b.json").exists()


def test_segmented_kernels_benchmark_smoke():
    """benchmarks/segmented_kernels.py on the CPU (no Triton kernels there): the library's call, the call without
    the finiteness check and the floor are timed; configurations are parsed with errors naming the entry."""
    bench = _load("segmented_kernels")
    records = bench.run("cpu", sources=(2, 3), repeats=2, shapes=[(8, 3, 3, 3), (8,), (10, 8)])
    assert {(r["n_sources"], r["row"]) for r in records} == {
        (n, row) for n in (2, 3) for row in ("copy floor", "fedgp", "fedgp without check", "arithmetic only, eager")}
    for r in records:
        assert r["median_ms"] > 0 and math.isfinite(r["ratio_to_floor"])
        assert r["two_pass_bound"] == (2 * r["n_sources"] + 3) / (2 * r["n_sources"])
    assert "no Triton kernels" in bench.format_report(records, bench.environment(bench.resolve_device("cpu")))
    assert bench.label(bench.parse_config("tile:8192:4")) == "tile:8192:4"
    for bad in ["tile:8192", "tile:x:4", "warp:8192:4"]:
        with pytest.raises(ValueError):
            bench.parse_config(bad)
    import fda_core.core.aggregation as agg
    check = agg._check_finite
    with bench._without_finiteness_check():
        assert agg._check_finite is not check
    assert agg._check_finite is check  # the library's check is back


def test_inb_benchmark_reads_full_mnist_from_a_data_root(tmp_path):
    """benchmarks/inb.py --data-root (the paper's 1,000 digits per class need full MNIST): a tiny IDX folder."""
    import gzip
    import struct

    import numpy as np

    def write_idx(path, arr):
        header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
        with gzip.open(path, "wb") as f:
            f.write(header + arr.tobytes())

    rng = np.random.default_rng(0)
    folder = tmp_path / "MNIST" / "raw"
    folder.mkdir(parents=True)
    for prefix, per_class in [("train", 41), ("t10k", 2)]:
        labels = np.repeat(np.arange(10, dtype=np.uint8), per_class)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (labels.size, 28, 28), dtype=np.uint8))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    bench = _load("inb")
    rec = bench.run(quick=True, device="cpu", reference=False, data_root=str(tmp_path))
    assert rec["data"].startswith("IDX files in") and rec["n_per_class"] == 40 and rec["fast_seconds"] > 0
    assert "IDX files in" in bench.format_report(rec)


def test_host_work_benchmark_takes_the_gpu_code_path_on_the_cpu():
    """benchmarks/aggregation_host_work.py: on the CPU the rules go through the Triton wrappers (kernels stubbed), so
    the reduce wrapper's per-segment product (aten.mm) is counted with torch coefficients, and not with the third
    kernel's (which needs fewer operator calls, at most 8 with β a Python number); a prepared call, its graph's replay
    stubbed too, makes one (the flag's read); everything is restored afterwards."""
    import fda_core.core.aggregation as agg
    import fda_core.core.segmented as seg

    before = (agg._segmented, seg._triton, agg.LAYERWISE_COEFFICIENTS)
    bench = _load("aggregation_host_work")
    records = bench.run("cpu", sources=(2,), repeats=3, scale=10000)
    assert [(r["coefficients"], r["rule"], r["form"]) for r in records] == [
        (c, r, f) for c in bench.COEFFICIENTS for r in bench.RULES for f in bench.FORMS if f == "call" or c == "kernel"]
    calls = {(r["coefficients"], r["rule"], r["form"]): r["operator_calls"] for r in records}
    for r in records:
        if r["form"] == "prepared":  # the graph's replay is stubbed: what is left is the read of the kernels' flag
            assert r["operators"] == {"aten._local_scalar_dense.default": 1} and r["host_us"] > 0, r
            continue
        assert r["operator_calls"] == sum(r["operators"].values()) >= 5 and r["host_us"] > 0
        assert (r["operators"].get("aten.mm.default", 0) >= 1) == (r["coefficients"] == "torch")
    assert all(calls["kernel", rule, "call"] < calls["torch", rule, "call"] for rule in bench.RULES)
    # with a Python β the kernel path packs its parameters in Python: one host tensor (lift_fresh), four buffers
    # (the reduction's partials, the coefficients, the checks), the flag's zeros, the slice of a, the flag's read
    assert all(calls["kernel", rule, "call"] <= 8 for rule in bench.RULES), calls
    assert (agg._segmented, seg._triton, agg.LAYERWISE_COEFFICIENTS) == before
    with pytest.raises(ValueError, match="coefficients"):
        bench.run("cpu", sources=(2,), repeats=1, scale=10000, coefficients=("triton",))
    assert "kernels stubbed" in bench.format_report(records, bench.environment(bench.resolve_device("cpu")))


def test_layerwise_call_launches_its_reduction_where_the_setting_says():
    """With the coefficients in the kernels (the default), a layer-wise call launches its first kernel after it checks
    β and the weights (``LAYERWISE_REDUCTION_LAUNCH = "late"``, the default) or before (``"early"``, so that host
    work overlaps the kernel on a GPU), as benchmarks/segmented_kernels.py's rows time them (the GPU code path on the
    CPU, kernels stubbed, as benchmarks/aggregation_host_work.py runs it); a bad β raises, naming it, either way; the
    torch coefficients check β first; a bad setting is named."""
    import fda_core.core.aggregation as agg
    from fda_core.core import segmented_triton

    bench = _load("aggregation_host_work")
    events = []

    class Recorded(bench._StubKernel):
        def __getitem__(self, grid):
            launch = super().__getitem__(grid)
            return lambda *args, **kwargs: (events.append("reduce"), launch(*args, **kwargs))

    checked_python = agg._checked_python  # every check of β passes through it, on the fused path and the torch path

    def check(value, blocks, name, *args, **kwargs):
        if name == "beta":
            events.append("beta")
        return checked_python(value, blocks, name, *args, **kwargs)

    S, t = torch.randn(3, 20), torch.randn(20)
    with bench.gpu_code_path_on_cpu(), mock.patch.object(segmented_triton, "_reduce_kernel", Recorded((4, 5))), \
            mock.patch.object(agg, "_checked_python", check):
        assert (agg.LAYERWISE_COEFFICIENTS, agg.LAYERWISE_REDUCTION_LAUNCH) == ("kernel", "late")
        for launch, order in (("late", ["beta", "reduce"]), ("early", ["reduce", "beta"])):
            with mock.patch.object(agg, "LAYERWISE_REDUCTION_LAUNCH", launch):
                events.clear()
                agg.fedgp(S, t, 0.5, segments=[5, 15])
                assert events == order, launch
                events.clear()
                with pytest.raises(ValueError, match="beta must lie in"):
                    agg.fedgp_cosine(S, t, 1.5, segments=[5, 15])
                assert events == order[:order.index("beta") + 1], launch
        events.clear()
        with mock.patch.object(agg, "LAYERWISE_COEFFICIENTS", "torch"):
            agg.fedgp(S, t, 0.5, segments=[5, 15])
        assert events == ["beta", "reduce"]
        with mock.patch.object(agg, "LAYERWISE_REDUCTION_LAUNCH", "soon"), \
                pytest.raises(ValueError, match="LAYERWISE_REDUCTION_LAUNCH must be 'late' or 'early'"):
            agg.fedgp(S, t, 0.5, segments=[5, 15])


def test_kernel_code_reads_instructions_and_needs_triton(capsys):
    """benchmarks/kernel_code.py without Triton: the PTX reader on a hand-written snippet (comments, debug lines,
    temporary labels and the DWARF sections dropped, the kernel's name normalised); the command refuses to run,
    naming where Triton is (the tests that compile for real are in tests/triton_checks.py)."""
    bench = _load("kernel_code")
    ptx = ("//\n// Generated\n.visible .entry _reduce_kernel(\n\t.param .u64 _reduce_kernel_param_0\n)\n{\n"
           "\t.loc\t1 10 4\n$L__tmp1:\n\tld.global.b32 \t%r7, [%rd3]; // a load\n\tadd.s32 \t%r2, %r7, %r7;\n"
           "\tret;\n}\n.section\t.debug_abbrev\n{\n.b8 1\n}\n")
    assert bench.instructions(ptx, "_reduce_kernel") == [
        ".visible .entry K(", ".param .u64 K", ")", "{", "ld.global.b32 \t%r0, [%rd0];", "add.s32 \t%r1, %r0, %r0;",
        "ret;", "}"]  # registers renumbered in order of first use, per class
    if bench.segmented_triton.triton is None:
        with pytest.raises(SystemExit):
            bench.main(["--against", "HEAD"])
        assert ".venv/triton" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_parallel_runs_benchmark_smoke():
    """benchmarks/parallel_runs.py --quick times one sweep with workers 1 and 2 and checks their results equal."""
    before = torch.get_num_threads()
    try:
        out = _load("parallel_runs").main(["--quick", "--device", "cpu"])
    finally:
        torch.set_num_threads(before)
    assert set(out["seconds"]) == {1, 2} and all(t > 0 for t in out["seconds"].values())
    assert out["threads_here"] == 1 and out["ratio_over_1"][2] > 0
    assert out["largest_difference_from_1"] == {2: 0.0}  # bit for bit on the CPU
    # the runs' own seconds over the wall: at most the worker count (runs cannot overlap more), above 0
    assert set(out["runs_in_flight"]) == {1, 2} and 0 < out["runs_in_flight"][1] <= 1 + 1e-9
    assert 0 < out["runs_in_flight"][2] <= 2 + 1e-9


def test_runs_in_flight_by_hand():
    """Three runs of 2, 3 and 5 s computed in a sweep of 4 s wall: 2.5 runs in flight on average."""
    in_flight = _load("parallel_runs").runs_in_flight
    assert in_flight([{"seconds": 2.0}, {"seconds": 3.0}, {"seconds": 5.0}], 4.0) == 2.5


def test_parallel_runs_largest_difference_by_hand():
    """The difference the GPU form of parallel_runs.py prints: the largest over numbers at the same places, wall
    seconds left out, inf where the structures differ."""
    diff = _load("parallel_runs").largest_difference
    a = [{"acc": [0.5, 0.75], "seed": 0, "rule": "fedgp", "seconds": 3.0}, {"acc": [0.25], "seed": 1}]
    b = [{"acc": [0.5, 0.625], "seed": 0, "rule": "fedgp", "seconds": 9.0}, {"acc": [0.5], "seed": 1}]
    assert diff(a, a) == 0.0 and diff(a, b) == 0.25
    assert diff([{"acc": [0.5]}], [{"acc": [0.5, 0.5]}]) == float("inf")
    assert diff({"rule": "fedgp"}, {"rule": "fedavg"}) == float("inf")
    assert diff({"x": 1}, {"y": 1}) == float("inf")


@pytest.mark.timeout(300)
def test_feddirt_benchmark_smoke():
    """benchmarks/feddirt.py --quick times both client forms of one FedDIRT run and reports their ratio."""
    before = torch.get_num_threads()
    try:
        out = _load("feddirt").main(["--quick", "--device", "cpu"])
    finally:
        torch.set_num_threads(before)
    assert set(out["ms_per_iteration"]) == {"loop", "vmap"} and all(t > 0 for t in out["ms_per_iteration"].values())
    assert out["ratio_loop_over_vmap"] > 0
    # the two forms train the same model to float32 rounding
    assert abs(out["final_loss"]["loop"] - out["final_loss"]["vmap"]) < 1e-3 * abs(out["final_loss"]["loop"])


def test_fedstargan_benchmark_smoke():
    """benchmarks/fedstargan.py --quick times FedStarGAN's clients one after another (losses read after every step,
    or at the end) and as one batched step: the same run, so the same losses (to rounding for the batched form)."""
    before = torch.get_num_threads()
    try:
        out = _load("fedstargan").main(["--quick", "--device", "cpu"])
    finally:
        torch.set_num_threads(before)
    forms = {"per-step", "loop", "vmap"}
    assert set(out["ms_per_iteration"]) == forms and all(t > 0 for t in out["ms_per_iteration"].values())
    assert out["losses"]["loop"] == out["losses"]["per-step"]
    assert out["losses"]["vmap"] == pytest.approx(out["losses"]["loop"], rel=1e-3)
    assert out["ratio_per_step_over_vmap"] == pytest.approx(out["ratio_per_step_over_loop"] * out["ratio_loop_over_vmap"])
    assert out["syncs_per_iteration"] == dict.fromkeys(forms)  # counted on CUDA only


@pytest.mark.timeout(300)
def test_wasserstein_benchmark_smoke():
    """benchmarks/wasserstein.py --quick times notebook 06's held-out WD by EMD and by Sinkhorn on the host and on
    the device (here the CPU: the same bits), and the host Sinkhorn forced into the log domain (the same values to
    rounding), with Sinkhorn's small bias against the exact value."""
    before = torch.get_num_threads()
    try:
        out = _load("wasserstein").main(["--quick", "--device", "cpu"])
        only = _load("wasserstein").main(["--quick", "--device", "cpu", "--forms", "emd", "device"])
    finally:
        torch.set_num_threads(before)
    assert set(out["seconds"]) == {"emd", "sinkhorn host", "sinkhorn device", "sinkhorn host log"}
    assert out["problems"] == 20
    assert out["max_rel_diff_device_vs_host"] == 0 and out["held_out_per_class"] == [12] * 10
    assert 0 <= out["max_rel_diff_auto_vs_log"] < 1e-12  # the kernel form's rounding, nothing more
    assert out["ratio_log_over_auto_host_sinkhorn"] > 0
    assert 0 < out["sinkhorn_bias_vs_emd"] < 0.03  # entropic OT's plan costs a little more than the optimal one
    assert set(only["seconds"]) == {"emd", "sinkhorn device"} and "ratio_host_over_device_sinkhorn" not in only
    assert only["mean_wd"]["emd"] == out["mean_wd"]["emd"]
    with pytest.raises(SystemExit):
        _load("wasserstein").main(["--n-per-class", "0"])  # the whole test file needs --data-root


@pytest.mark.timeout(300)
def test_shared_rounds_benchmark_smoke():
    """benchmarks/shared_rounds.py --quick times notebook 04's ColoredMNIST sweep with and without shared FedAvg rounds
    and checks their results are the same; Finetune_Offline takes all 3 rounds, each FDA method its warm-up round."""
    before = torch.get_num_threads()
    try:
        out = _load("shared_rounds").main(["--quick"])
    finally:
        torch.set_num_threads(before)
    assert out["same_results"] is True and out["ratio"] > 0
    taken = out["shared_rounds"]
    assert taken["Finetune_Offline (seed 0)"] == 3 and taken["Source only (seed 0)"] == 0
    assert taken["FedGP (cosine) (seed 0)"] == 1 and taken["Oracle (seed 0)"] == 0


def test_gpu_session_notebook_steps_pass_valid_parameters(fda_dry_run):
    """Every `fda run` step of benchmarks/gpu_session.sh names parameters its notebook declares, with values in their
    ranges (`fda run --dry-run`): a device lease is 15 minutes, and a renamed or narrowed parameter would otherwise
    be found only there, as a failed step."""
    import re
    import shlex

    script = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    values = {'"$STORE"': ".gpustore", '"$(workers)"': "8", '"${BATCHING:-auto}"': "auto"}
    steps = re.findall(r"^\s*(\w+)\) step \S+ \S+ python3 -m fda_core (run .*?) ;;$", script, flags=re.M)
    assert {name for name, _ in steps} >= {"nb02", "nb04p", "nb05p", "nb06p", "nb07p", "nb08p", "nb04full", "nb05full"}
    for name, command in steps:
        for variable, value in values.items():
            command = command.replace(variable, value)
        assert "$" not in command, f"{name}: unexpanded variable in {command}"
        code, err = fda_dry_run(shlex.split(command))
        assert code == 0, f"step {name}: {err}"

"""Layer-wise reductions and combination on flat buffers (fda_core.core.segmented, the GPU path of dict input).

Checked against a per-segment loop in float64 (hypothesis over segment lengths and chunk sizes), against the
per-tensor rules on dict input (every rule, views and copies, ``out`` variants), and — where Triton is importable —
the Triton kernels in Triton's CPU interpreter; on a CUDA machine the same checks run on the GPU.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fda_core.core.aggregation as agg
from fda_core.core.segmented import (layerwise_combine, layerwise_reductions, segment_combine, segment_dots,
                                     segment_plan, segment_sqnorms)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _loop(S, t, lengths, coefs=None, a=0.0):
    """Per-segment reference: dots, squared norms, target squared norms and the combination."""
    segs = list(torch.split(torch.arange(S.shape[1]), list(lengths)))
    dots = torch.stack([torch.stack([S[i, s] @ t[s] for s in segs]) for i in range(S.shape[0])])
    norms = torch.stack([torch.stack([S[i, s] @ S[i, s] for s in segs]) for i in range(S.shape[0])])
    tnorms = torch.stack([t[s] @ t[s] for s in segs])
    out = None
    if coefs is not None:
        out = a * t.clone()
        for i in range(S.shape[0]):
            for k, s in enumerate(segs):
                out[s] += coefs[i, k] * S[i, s]
    return dots, norms, tnorms, out


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=8), chunk=st.sampled_from([1, 3, 16, 64, 1024]),
       n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_chunked_functions_equal_a_per_segment_loop(lengths, chunk, n, seed):
    gen = torch.Generator().manual_seed(seed)
    m = sum(lengths)
    S = torch.randn(n, m, generator=gen, dtype=torch.float64)
    t = torch.randn(m, generator=gen, dtype=torch.float64)
    C = torch.randn(n, len(lengths), generator=gen, dtype=torch.float64)
    plan = segment_plan(lengths, "cpu", torch.float64, chunk)
    dots, norms, tnorms, out = _loop(S, t, lengths, C, 0.3)
    torch.testing.assert_close(segment_dots(S, t, plan), dots, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(segment_sqnorms(S, plan), norms, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(segment_sqnorms(t, plan), tnorms, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(segment_combine(S, t, 0.3, C, plan), out, rtol=1e-12, atol=1e-12)
    in_place = t.clone()  # out may be the target itself
    segment_combine(S, in_place, 0.3, C, plan, out=in_place)
    torch.testing.assert_close(in_place, out, rtol=1e-12, atol=1e-12)


def test_plan_hand_case():
    # segments [0, 3), [3, 5), [5, 11); chunks of 4: [0, 4) straddles, [4, 8) straddles, tail [8, 11)
    plan = segment_plan([3, 2, 6], "cpu", torch.float64, 4)
    assert plan.n_chunks == 2 and plan.m == 11
    assert plan.chunk_to_segment.sum().item() == 0  # both chunks straddle a boundary
    assert plan.gathered.tolist() == list(range(11))
    assert plan.gathered_segment.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2]
    plan = segment_plan([8, 3], "cpu", torch.float64, 4)  # two interior chunks of segment 0, tail in segment 1
    assert plan.chunk_to_segment.tolist() == [[1, 0], [1, 0]]
    assert plan.gathered.tolist() == [8, 9, 10]
    assert segment_plan([8, 3], "cpu", torch.float64, 4) is plan  # cached


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="lengths"):
        segment_plan([3, 0], "cpu")
    with pytest.raises(ValueError, match="chunk"):
        segment_plan([3], "cpu", chunk=0)
    plan = segment_plan([3, 2], "cpu", torch.float64, 2)
    with pytest.raises(ValueError, match="m = 5"):
        segment_dots(torch.zeros(2, 6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64), plan)
    with pytest.raises(ValueError, match="coefs"):
        segment_combine(torch.zeros(2, 5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64), 1.0,
                        torch.zeros(3, 2, dtype=torch.float64), plan)


SHAPES = {"conv.weight": (6, 3, 3, 3), "conv.bias": (6,), "bn.weight": (6,), "fc.weight": (10, 150), "fc.bias": (10,)}


def _dicts(rows):
    out = []
    for row in rows:
        d, off = {}, 0
        for k, s in SHAPES.items():
            n = torch.Size(s).numel()
            d[k] = row[off:off + n].view(s)
            off += n
        out.append(d)
    return out


def _rule_calls(src, tgt, parts):
    return {
        "fedgp": lambda out=None: agg.fedgp(src, tgt, [0.2, 0.7, 0.5], [1.0, 2.0, 3.0], out=out),
        "fedgp_nofilter": lambda out=None: agg.fedgp_nofilter(src, tgt, 0.4, out=out),
        "fedgp_cosine": lambda out=None: agg.fedgp_cosine(src, tgt, 0.5, alignment=[0.5, 1.0, 2.0], out=out),
        "fedda": lambda out=None: agg.fedda(src, tgt, 0.3, out=out),
        "source_only": lambda out=None: agg.source_only(src, out=out),
        "fedgp_auto": lambda out=None: agg.fedgp_auto(src, parts, out=out),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("copies", [False, True])
def test_every_rule_on_dicts_agrees_between_the_loop_and_the_segmented_backend(monkeypatch, device, copies):
    gen = torch.Generator().manual_seed(3)
    m = sum(torch.Size(s).numel() for s in SHAPES.values())
    S = torch.randn(3, m, generator=gen).to(device)
    parts = torch.randn(4, m, generator=gen).to(device)
    t = parts.mean(0)
    src, tgt = _dicts(S), _dicts(t.unsqueeze(0))[0]
    part_dicts = _dicts(parts)
    if copies:  # separate tensors (a state dict), not views of one buffer
        src = [{k: v.clone() for k, v in d.items()} for d in src]
        tgt = {k: v.clone() for k, v in tgt.items()}
    monkeypatch.setattr(agg, "LAYERWISE_BACKEND", "loop")
    expected = {name: fn() for name, fn in _rule_calls(src, tgt, part_dicts).items()}
    monkeypatch.setattr(agg, "LAYERWISE_BACKEND", "segmented")
    for name, fn in _rule_calls(src, tgt, part_dicts).items():
        got = fn()
        assert set(got) == set(SHAPES), name
        for k in SHAPES:
            assert got[k].shape == SHAPES[k]
            torch.testing.assert_close(got[k], expected[name][k], rtol=1e-5, atol=1e-6, msg=f"{name}[{k}]")
        # out: a dict of views into one flat buffer (written in place) and a dict of separate tensors
        flat_out = _dicts(torch.full((1, m), float("nan"), device=device))[0]
        separate = {k: torch.full(s, float("nan"), device=device) for k, s in SHAPES.items()}
        for out in (flat_out, separate):
            assert fn(out=out) is out
            for k in SHAPES:
                torch.testing.assert_close(out[k], expected[name][k], rtol=1e-5, atol=1e-6, msg=f"{name} out[{k}]")


def test_views_of_one_buffer_are_read_in_place(monkeypatch):
    m = sum(torch.Size(s).numel() for s in SHAPES.values())
    S = torch.randn(2, m)
    src, tgt = _dicts(S), _dicts(torch.randn(1, m))[0]
    monkeypatch.setattr(agg, "LAYERWISE_BACKEND", "segmented")
    blocks = agg._normalise(src, tgt)
    assert blocks.flat.sources.data_ptr() == S.data_ptr() and blocks.flat.sources.stride() == (m, 1)
    copies = [{k: v.clone() for k, v in d.items()} for d in src]
    blocks = agg._normalise(copies, tgt)
    assert blocks.flat.sources.data_ptr() != S.data_ptr()
    torch.testing.assert_close(blocks.flat.sources, S)


@pytest.mark.parametrize("device", DEVICES)
def test_segmented_backend_still_names_non_finite_input(monkeypatch, device):
    m = sum(torch.Size(s).numel() for s in SHAPES.values())
    S = torch.randn(2, m, device=device)
    S[1, 5] = float("nan")
    monkeypatch.setattr(agg, "LAYERWISE_BACKEND", "segmented")
    with pytest.raises(ValueError, match=r"source_grads\[1\]\['conv.weight'\] contains NaN"):
        agg.fedgp(_dicts(S), _dicts(torch.randn(1, m, device=device))[0], 0.5)


def test_backend_setting_is_checked(monkeypatch):
    monkeypatch.setattr(agg, "LAYERWISE_BACKEND", "gpu")
    with pytest.raises(ValueError, match="LAYERWISE_BACKEND"):
        m = sum(torch.Size(s).numel() for s in SHAPES.values())
        agg.fedgp(_dicts(torch.randn(2, m)), _dicts(torch.randn(1, m))[0], 0.5)


@pytest.mark.parametrize("device", DEVICES)
def test_python_beta_and_weights_are_checked_on_the_host(device):
    src = torch.randn(2, 7, device=device)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        agg.fedgp(src, torch.randn(7, device=device), [0.5, 1.5])
    with pytest.raises(ValueError, match="weights must be non-negative"):
        agg.fedda(src, torch.randn(7, device=device), 0.5, [1.0, -1.0])
    with pytest.raises(ValueError, match="alignment must be non-negative"):
        agg.fedgp_cosine(src, torch.randn(7, device=device), 0.5, alignment=[1.0, -2.0])
    out = agg.fedgp_cosine(src, torch.randn(7, device=device), 0.5, alignment=[1.0, 2.0])
    assert out.device.type == device


SEGMENT_RULES = {
    "fedgp": lambda src, tgt, **kw: agg.fedgp(src, tgt, [0.2, 0.7, 0.5], [1.0, 2.0, 3.0], **kw),
    "fedgp_nofilter": lambda src, tgt, **kw: agg.fedgp_nofilter(src, tgt, 0.4, **kw),
    "fedgp_cosine": lambda src, tgt, **kw: agg.fedgp_cosine(src, tgt, 0.5, alignment=[0.5, 1.0, 2.0], **kw),
    "fedgp_cosine_nofilter": lambda src, tgt, **kw: agg.fedgp_cosine(src, tgt, 0.5, alignment=[0.5, 1.0, 2.0],
                                                                      filter_negative=False, **kw),
}


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=7), backend=st.sampled_from(["loop", "segmented"]),
       rule=st.sampled_from(sorted(SEGMENT_RULES)), seed=st.integers(0, 2**16))
def test_segments_form_equals_the_dict_form_bit_for_bit(lengths, backend, rule, seed):
    """fedgp(S, t, β, segments=lengths) is the dict form on views of the same rows, the same bits on either backend
    (the engine passes segments, so CPU results did not move when it stopped building dicts)."""
    gen = torch.Generator().manual_seed(seed)
    m = sum(lengths)
    S, t = torch.randn(3, m, generator=gen), torch.randn(m, generator=gen)
    S[0, : lengths[0]] = 0.0  # a zero segment of a source: its projection is 0, no NaN
    names = [f"p{k}" for k in range(len(lengths))]
    # views of the very same memory: a BLAS dot's rounding may depend on the address alignment of its operands
    views = [dict(zip(names, row.split(lengths))) for row in [*S, t]]
    fn = SEGMENT_RULES[rule]
    old = agg.LAYERWISE_BACKEND
    agg.LAYERWISE_BACKEND = backend
    try:
        expected = torch.cat([v.reshape(-1) for v in fn(views[:3], views[3]).values()])
        got = fn(S, t, segments=lengths)
        out = torch.full((m,), float("nan"))
        assert fn(S, t, segments=tuple(lengths), out=out) is out
        in_place = t.clone()  # out may be the target itself
        fn(S, in_place, segments=lengths, out=in_place)
    finally:
        agg.LAYERWISE_BACKEND = old
    assert got.shape == (m,) and torch.equal(got, expected) and torch.equal(out, expected)
    torch.testing.assert_close(in_place, expected, rtol=0, atol=0)


def test_segments_hand_case():
    # two segments; source 0 projects positively on segment 0 and negatively on segment 1 (filtered out there)
    S = torch.tensor([[1.0, 0.0, -1.0], [0.0, 2.0, 0.0]])
    t = torch.tensor([2.0, 1.0, 3.0])
    got = agg.fedgp(S, t, 1.0, segments=[2, 1])
    # segment 0: ⟨t, s_0⟩ = 2, ‖s_0‖² = 1 → 2·s_0 = (2, 0); ⟨t, s_1⟩ = 2, ‖s_1‖² = 4 → s_1/2 = (0, 1); weights 1/2
    # segment 1: ⟨t, s_0⟩ = −3 → 0; s_1 is zero there → 0
    torch.testing.assert_close(got, torch.tensor([1.0, 0.5, 0.0]))
    flat = agg.fedgp(S, t, 1.0)  # one projection over all three entries differs
    assert not torch.allclose(flat, got)


@pytest.mark.parametrize("backend", ["loop", "segmented"])
def test_segments_bad_input_names_the_parameter(monkeypatch, backend):
    monkeypatch.setattr(agg, "LAYERWISE_BACKEND", backend)
    S, t = torch.randn(2, 6), torch.randn(6)
    for bad, match in [([2, 3], "segments must sum to m = 6"), ([0, 6], "positive integers"), ([2.0, 4], "positive integers"),
                       ("24", "sequence of positive segment lengths"), ([], "positive integers")]:
        with pytest.raises(ValueError, match=match):
            agg.fedgp(S, t, 0.5, segments=bad)
    with pytest.raises(ValueError, match=r"one \(N, m\) tensor"):
        agg.fedgp([S[0], S[1]], t, 0.5, segments=[6])
    with pytest.raises(ValueError, match=r"one \(m,\) tensor"):
        agg.fedgp(S, t.view(2, 3), 0.5, segments=[6])
    with pytest.raises(ValueError, match="out must be a contiguous tensor of shape \\(6,\\)"):
        agg.fedgp(S, t, 0.5, segments=[6], out=torch.empty(5))
    with pytest.raises(ValueError, match="shares memory with source_grads"):
        agg.fedgp(S, t, 0.5, segments=[6], out=S[1])
    bad_source, bad_target = S.clone(), t.clone()
    bad_source[1, 4], bad_target[0] = float("nan"), float("inf")
    where = " \\(segment 1\\)" if backend == "loop" else ""
    with pytest.raises(ValueError, match=r"source_grads\[1\]" + where + " contains NaN"):
        agg.fedgp(bad_source, t, 0.5, segments=[3, 3])
    with pytest.raises(ValueError, match="target_grad.* contains NaN or inf"):
        agg.fedgp_cosine(S, bad_target, 0.5, segments=[3, 3])


def test_fedgp_auto_with_segments_equals_its_dict_form():
    """β is estimated on the whole flat gradients, the projection is per segment: as for dicts; numpy lengths too."""
    import numpy as np

    gen = torch.Generator().manual_seed(11)
    lengths = [5, 3, 12]
    S, parts = torch.randn(3, 20, generator=gen), torch.randn(4, 20, generator=gen)
    dicts = [dict(zip("abc", row.split(lengths))) for row in [*S, *parts]]
    expected, beta_dicts = agg.fedgp_auto(dicts[:3], dicts[3:], return_beta=True)
    got, beta = agg.fedgp_auto(S, parts, segments=np.array(lengths), return_beta=True)
    assert torch.equal(beta, beta_dicts)
    torch.testing.assert_close(got, torch.cat([v.reshape(-1) for v in expected.values()]), rtol=0, atol=0)
    with pytest.raises(ValueError, match="positive integers"):
        agg.fedgp(S, parts.mean(0), 0.5, segments=[True, 19])


def test_round_results_read_the_segments_from_as_dict():
    from fda_core.experiments.methods import RoundResults

    layout = [("w", 0, 4, torch.Size([2, 2])), ("b", 4, 2, torch.Size([2]))]

    def make(as_dict):
        return RoundResults(source_updates=torch.zeros(2, 6), source_steps=[1, 1], weights=torch.tensor([0.5, 0.5]),
                            source_buffers=[{}, {}], target_update=torch.zeros(6), target_params=torch.zeros(6),
                            target_parts=None, target_steps=1, target_buffers={}, lr_source=1e-3, lr_target=1e-3,
                            scratch=torch.empty(6), as_dict=as_dict, as_dicts=lambda rows: [as_dict(r) for r in rows])

    res = make(lambda v: {n: v[o:o + k].view(s) for n, o, k, s in layout})
    assert res.segment_lengths() == (4, 2)
    with pytest.raises(ValueError, match="tile the flat vector"):
        make(lambda v: {"b": v[4:6], "w": v[0:4].view(2, 2)}).segment_lengths()
    with pytest.raises(ValueError, match="cover 4 of"):
        make(lambda v: {"w": v[0:4].view(2, 2)}).segment_lengths()


def _triton_env() -> dict | None:
    """The environment of a subprocess that can import Triton: this one when Triton is importable here, else one with
    the separate copy ``make test`` installs (``$FDA_TRITON_DIR``, default .venv/triton: outside the venv's
    site-packages, so that the CPU torch never sees it) on PYTHONPATH; None when there is neither."""
    if importlib.util.find_spec("triton") is not None:
        return dict(os.environ)
    where = Path(os.environ.get("FDA_TRITON_DIR") or Path(__file__).resolve().parent.parent / ".venv" / "triton")
    if not (where / "triton" / "__init__.py").is_file():
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")]))}


def _run_triton_checks(check: str, **env: str) -> None:
    base = _triton_env()
    if base is None:
        pytest.skip("Triton is not installed (make test installs it into .venv/triton; the CPU torch wheel has none)")
    script = Path(__file__).resolve().parent / "triton_checks.py"
    done = subprocess.run([sys.executable, "-W", "ignore", str(script), check], env={**base, **env},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_triton_kernels_in_the_interpreter():
    """The GPU kernels run by Triton's CPU interpreter (tests/triton_checks.py ``interpreted``): every form of the
    reduction and combination, the three-kernel projection, and the rules with LAYERWISE_COEFFICIENTS = "kernel"."""
    _run_triton_checks("interpreted", TRITON_INTERPRET="1")


def test_triton_kernels_compile_for_hopper():
    """Every kernel variant compiled for sm_90 (H100/H200) on the CPU: what the interpreter cannot check."""
    _run_triton_checks("compiled")


def test_coefficient_placement_is_checked_and_changes_nothing_on_the_cpu(monkeypatch):
    """LAYERWISE_COEFFICIENTS: a bad value is named; on the CPU (no Triton kernels) "kernel" leaves every bit as is."""
    lengths = [5, 3, 8]
    gen = torch.Generator().manual_seed(0)
    S, t = torch.randn(3, 16, generator=gen), torch.randn(16, generator=gen)
    for rule in ("fedgp", "fedgp_nofilter", "fedgp_cosine", "fedgp_cosine_nofilter"):
        default = SEGMENT_RULES[rule](S, t, segments=lengths)
        for placement in ("torch", "kernel"):
            monkeypatch.setattr(agg, "LAYERWISE_COEFFICIENTS", placement)
            assert torch.equal(SEGMENT_RULES[rule](S, t, segments=lengths), default)
        monkeypatch.setattr(agg, "LAYERWISE_COEFFICIENTS", "triton")
        with pytest.raises(ValueError, match="LAYERWISE_COEFFICIENTS"):
            SEGMENT_RULES[rule](S, t, segments=lengths)
        monkeypatch.undo()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("config", [None, "loop:1024:4", "tile:8192:8", "tile:4096:4"])
@pytest.mark.parametrize("n_sources", [4, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_layerwise_functions_equal_the_cpu_loop(dtype, n_sources, config):
    """Every kernel form (the library's default and the others ``benchmarks/segmented_kernels.py`` times) on CUDA."""
    from contextlib import nullcontext

    from fda_core.core.segmented_triton import KernelConfig, configured

    lengths = (9408, 64, 64, 36864, 1, 2048 * 3, 513)
    gen = torch.Generator().manual_seed(5)
    m = sum(lengths)
    S = torch.randn(n_sources, m, generator=gen, dtype=torch.float64)
    t = torch.randn(m, generator=gen, dtype=torch.float64)
    C = torch.randn(n_sources, len(lengths), generator=gen, dtype=torch.float64)
    dots, norms, tnorms, out = _loop(S, t, lengths, C, 0.3)
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-9)
    Sg, tg = S.to("cuda", dtype), t.to("cuda", dtype)
    form = nullcontext() if config is None else configured(KernelConfig.parse(config))
    with form:
        d, n2, t2 = layerwise_reductions(Sg, tg, lengths)
        result = torch.full_like(tg, float("nan"))
        sums = layerwise_combine(Sg, tg, 0.3, C.to("cuda", dtype), lengths, out=result)
    torch.testing.assert_close(d.double().cpu(), dots, **tol)
    torch.testing.assert_close(n2.double().cpu(), norms, **tol)
    torch.testing.assert_close(t2.double().cpu(), tnorms, **tol)
    torch.testing.assert_close(result.double().cpu(), out, **tol)
    assert torch.isfinite(sums).all()


def test_kernel_config_is_checked_and_sizes_its_chunks():
    """The Triton kernels' configuration (defined whether or not Triton is importable): bad values name the field;
    the tile form shrinks its chunk as N grows (block = N_pad · chunk)."""
    from fda_core.core.segmented_triton import KernelConfig, configured, default_config

    for kwargs, field in [({"form": "warp"}, "form"), ({"block": 1000}, "block"), ({"block": 8}, "block"),
                          ({"num_warps": 3}, "num_warps")]:
        with pytest.raises(ValueError, match=field):
            KernelConfig(**kwargs)
    assert KernelConfig("loop", 2048, 8).chunk(10) == 2048
    assert [KernelConfig("tile", 8192, 8).chunk(n) for n in (1, 2, 3, 4, 5, 10, 16, 17)] == \
        [8192, 4096, 2048, 2048, 1024, 512, 512, 256]
    assert KernelConfig("tile", 32, 1).chunk(10) == 16  # never below 16 elements
    assert KernelConfig.parse("tile:8192:4") == KernelConfig("tile", 8192, 4)
    assert KernelConfig.parse(KernelConfig("loop", 1024, 2).label) == KernelConfig("loop", 1024, 2)
    for bad, field in [("tile:8192", "form:block:num_warps"), ("tile:x:4", "integers"), ("warp:8192:4", "form")]:
        with pytest.raises(ValueError, match=field):
            KernelConfig.parse(bad)
    before = default_config()
    with pytest.raises(RuntimeError):
        with configured(KernelConfig("tile", 4096, 4)) as c:
            assert default_config() is c
            raise RuntimeError("boom")
    assert default_config() is before  # restored after an error
    with pytest.raises(ValueError, match="KernelConfig"):
        with configured("tile:4096:4"):
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_coefficient_kernel_equals_torch_bit_for_bit():
    """The coefficient kernel on CUDA against torch's formula with IEEE square roots, bit for bit, subnormal and zero
    sums included (tests/triton_checks.py; the interpreter runs the same check on the CPU, but only the device shows
    whether compiled division and square roots flush subnormals or approximate)."""
    from triton_checks import coefficients_bitwise

    coefficients_bitwise("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("coefficients", ["torch", "kernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rule", sorted(SEGMENT_RULES))
def test_gpu_coefficient_placements_equal_the_cpu_loop(rule, dtype, coefficients, monkeypatch):
    """Both LAYERWISE_COEFFICIENTS settings on CUDA, segments and dict forms, against the CPU per-segment loop; the
    flat form against the CPU's flat computation."""
    monkeypatch.setattr(agg, "LAYERWISE_COEFFICIENTS", coefficients)
    lengths = [9408, 64, 1, 36864, 2048 * 3, 513]
    gen = torch.Generator().manual_seed(7)
    S = torch.randn(3, sum(lengths), generator=gen, dtype=torch.float64)
    t = torch.randn(sum(lengths), generator=gen, dtype=torch.float64)
    S[1, :9408] = 0
    S[2, 9408:9472] = -t[9408:9472]
    ref = SEGMENT_RULES[rule](S, t, segments=lengths)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    Sg, tg = S.to("cuda", dtype), t.to("cuda", dtype)
    out = torch.full_like(tg, float("nan"))
    SEGMENT_RULES[rule](Sg, tg, segments=lengths, out=out)
    torch.testing.assert_close(out.double().cpu(), ref, **tol)
    keys = [f"p{k}" for k in range(len(lengths))]
    got = SEGMENT_RULES[rule]([dict(zip(keys, r.split(lengths))) for r in Sg], dict(zip(keys, tg.split(lengths))))
    torch.testing.assert_close(torch.cat([got[k] for k in keys]).double().cpu(), ref, **tol)
    # the flat form (no segments): on CUDA the kernels with one segment, against the CPU's flat computation
    torch.testing.assert_close(SEGMENT_RULES[rule](Sg, tg).double().cpu(), SEGMENT_RULES[rule](S, t), **tol)
    bad = Sg.clone()
    bad[0, 3] = float("inf")
    with pytest.raises(ValueError, match=r"source_grads\[0\]"):
        SEGMENT_RULES[rule](bad, tg, segments=lengths)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("coefficients", ["torch", "kernel"])
@pytest.mark.parametrize("rule", ["fedgp", "fedgp_cosine"])
def test_segments_call_on_cuda_synchronises_the_host_once(rule, coefficients, monkeypatch):
    """Python β, weights and alignment reach the device by asynchronous copies; the one host synchronisation left
    is the finiteness check (torch's CUDA sync debug mode counts them), with either coefficient placement."""
    from fda_core.common.devices import host_synchronisations

    monkeypatch.setattr(agg, "LAYERWISE_COEFFICIENTS", coefficients)
    lengths = [300, 7, 2048 * 2 + 5]
    S, t = torch.randn(3, sum(lengths), device="cuda"), torch.randn(sum(lengths), device="cuda")
    out = torch.empty_like(t)
    call = lambda: SEGMENT_RULES[rule](S, t, out=out, segments=lengths)  # noqa: E731
    call()  # the first call builds and caches the chunk table
    syncs = host_synchronisations(call, "cuda")
    assert syncs == 1, syncs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("coefficients", ["torch", "kernel"])
@pytest.mark.parametrize("given, expected", [("host tensors", 1), ("device tensors", 3)])
def test_tensor_arguments_on_cuda_cost_one_synchronisation_each_on_the_device(given, expected, coefficients,
                                                                             monkeypatch):
    """β and the weights as CPU tensors are checked on the host and copied asynchronously: the call synchronises once
    (its finiteness check); as device tensors each is checked with one read (3 synchronisations in all, 7 before
    2026-11-26's sixth session)."""
    from fda_core.common.devices import host_synchronisations

    monkeypatch.setattr(agg, "LAYERWISE_COEFFICIENTS", coefficients)
    lengths = [300, 7, 2048 * 2 + 5]
    S, t = torch.randn(3, sum(lengths), device="cuda"), torch.randn(sum(lengths), device="cuda")
    where = "cpu" if given == "host tensors" else "cuda"
    beta, weights = torch.tensor([0.2, 0.7, 0.5], device=where), torch.tensor([1.0, 2.0, 3.0], device=where)
    out = torch.empty_like(t)
    call = lambda: agg.fedgp(S, t, beta, weights, out=out, segments=lengths)  # noqa: E731
    call()
    torch.testing.assert_close(out, SEGMENT_RULES["fedgp"](S, t, segments=lengths))
    syncs = host_synchronisations(call, "cuda")
    assert syncs == expected, syncs


def test_host_synchronisations_are_not_counted_off_cuda():
    """fda_core.common.devices.host_synchronisations: None on the CPU, where torch has no sync debug mode, and the
    function is not called (on CUDA, test_segments_call_on_cuda_synchronises_the_host_once counts one)."""
    from fda_core.common.devices import host_synchronisations

    calls = []
    assert host_synchronisations(lambda: calls.append(1), "cpu") is None
    assert calls == []


def test_host_synchronisations_per_step_cancel_the_set_up(monkeypatch):
    """host_synchronisations_per_step: the counts of a short and a long run, their difference per step (a run that
    synchronises 3 times to set up and twice per step gives 2); None on the CPU without calling the loop; a bad
    pair of lengths is refused."""
    from fda_core.common import devices

    ran = []
    assert devices.host_synchronisations_per_step(ran.append, "cpu", 10, 20) is None and ran == []

    def fake(fn, device):  # as on CUDA: the run is called and its synchronisations counted
        fn()
        return 3 + 2 * ran[-1]

    monkeypatch.setattr(devices, "host_synchronisations", fake)
    assert devices.host_synchronisations_per_step(ran.append, "cuda", 10, 20) == 2 and ran == [10, 20]
    with pytest.raises(ValueError, match="long must exceed short"):
        devices.host_synchronisations_per_step(ran.append, "cuda", 20, 20)

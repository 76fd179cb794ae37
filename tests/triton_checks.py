"""The Triton kernels of fda_core.core.segmented_triton checked without a GPU; run by tests/test_segmented.py in a
subprocess (Triton reads TRITON_INTERPRET when it is imported):

* ``interpreted`` (TRITON_INTERPRET=1, Triton's CPU interpreter runs the kernels as Python on CPU tensors): every
  form of the reduction and combination, the three-kernel projection (exact and cosine, with and without the
  filter, float32 and float64) against the pure-torch functions of fda_core.core.segmented, and the public rules
  with ``LAYERWISE_COEFFICIENTS = "kernel"`` against the per-segment loop, including bad input, the flat form as one
  segment against the CPU's flat computation, the projection with its first pass launched ahead
  (``start_projection``), and benchmarks/segmented_kernels.py's rows of that path;
* ``compiled``: every kernel variant compiled for a Hopper GPU (sm_90) by Triton's compiler and ptxas on the CPU,
  which catches what the interpreter cannot (types across branches, operations a dtype lacks), and every kernel's
  launch binder built for it (argument names that Triton's binder shadows).

Prints ``ok`` when every check passed.
"""

import re
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import torch

import fda_core.core.aggregation as agg
import fda_core.core.segmented as seg
from fda_core.core import segmented_triton as T

CASES = [((5000, 3, 64, 2048, 4097), 3), ((10,), 3), ((700, 1, 33), 5), ((300, 2), 1)]
CONFIGS = [None, T.KernelConfig("loop", 256, 4), T.KernelConfig("tile", 256, 4), T.KernelConfig("tile", 8192, 8)]


def tolerance(dtype):
    return {} if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)


def reductions_and_combination():
    torch.manual_seed(0)
    for lengths, n in CASES:
        m = sum(lengths)
        S, t = torch.randn(n, m, dtype=torch.float64), torch.randn(m, dtype=torch.float64)
        plan = seg.segment_plan(lengths, "cpu", torch.float64)
        for config in CONFIGS:
            table = T.table_for(lengths, S, config)
            d, n2, t2 = T.reduce(S, t, table, config)
            torch.testing.assert_close(d, seg.segment_dots(S, t, plan))
            torch.testing.assert_close(n2, seg.segment_sqnorms(S, plan))
            torch.testing.assert_close(t2, seg.segment_sqnorms(t, plan))
            C = torch.randn(n, len(lengths), dtype=torch.float64)
            out = torch.full_like(t, float("nan"))
            sums = T.combine(S, t, torch.tensor(0.3, dtype=torch.float64), C, table, out, config)
            ref = seg.segment_combine(S, t, 0.3, C, plan)
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(sums.sum(), ref.sum())
    try:
        T.reduce(S, t, T.table_for(lengths, S), T.KernelConfig("tile", 64, 4))
    except ValueError as e:
        assert "table_for" in str(e)
    else:
        raise AssertionError("a table cut for another config was accepted")


def projection():
    """T.project against the torch formulas (docs/theory.md § Rules) on the chunked torch reductions."""
    torch.manual_seed(0)
    for dtype in (torch.float64, torch.float32):
        for lengths, n in CASES:
            m = sum(lengths)
            S, t = torch.randn(n, m, dtype=dtype), torch.randn(m, dtype=dtype)
            S[0, :3] = 0  # a zero segment (when the first segment is 3 long): its coefficient is 0
            plan = seg.segment_plan(lengths, "cpu", dtype)
            d, n2, t2 = seg.segment_dots(S, t, plan), seg.segment_sqnorms(S, plan), seg.segment_sqnorms(t, plan)
            wb, scale = torch.rand(n, dtype=dtype) / n, torch.rand(n, dtype=dtype) + 0.5
            a = 1 - wb.sum()
            params = torch.cat([wb, scale, a.reshape(1)])
            for config in CONFIGS[:3]:
                table = T.table_for(lengths, S, config)
                for mode in T.PROJECTIONS:
                    for filter_negative in (True, False):
                        out = torch.full_like(t, float("nan"))
                        flag, checks = T.project(S, t, params, table, out, projection=mode,
                                                 filter_negative=filter_negative, config=config)
                        num = d.clamp_min(0) if filter_negative else d
                        den = n2 if mode == "exact" else n2.sqrt() * t2.sqrt()
                        factor = torch.where(den > 0, num / den, 0.0) * (scale[:, None] if mode == "cosine" else 1)
                        ref = seg.segment_combine(S, t, a, wb[:, None] * factor, plan)
                        torch.testing.assert_close(out, ref, **tolerance(dtype))
                        torch.testing.assert_close(checks, torch.stack([d, n2]), **tolerance(dtype))
                        assert float(flag) == 0.0, flag
                # the first pass launched ahead (start_projection, as the rules do): the same bits
                early = torch.full_like(t, float("nan"))
                reduction = T.start_projection(S, t, table, config)
                T.project(S, t, params, table, early, projection="cosine", config=config, reduction=reduction)
                T.project(S, t, params, table, out, projection="cosine", config=config)
                assert torch.equal(early, out)
            other = T.table_for(list(lengths) + [1], torch.cat([S, S[:, :1]], 1))
            expect_error(lambda: T.project(S, t, params, T.table_for(lengths, S), torch.empty_like(t),
                                           reduction=T.start_projection(torch.cat([S, S[:, :1]], 1),
                                                                        torch.cat([t, t[:1]]), other)),
                         "reduction was started for another")
            table = T.table_for(lengths, S)
            expect_error(lambda: T.project(S, t, params, table, torch.empty_like(t), config=T.KernelConfig.parse(
                "tile:8192:8"), reduction=T.start_projection(S, t, table)), "kernel configuration")
            S[-1, 5] = float("inf")
            flag, _ = T.project(S, t, params, T.table_for(lengths, S), torch.empty_like(t))
            assert flag.isnan().all(), flag
    for bad, match in [(dict(projection="angle"), "projection"), (dict(params=torch.zeros(2)), "params")]:
        try:
            T.project(S, t, bad.get("params", params), T.table_for(lengths, S), torch.empty_like(t),
                      projection=bad.get("projection", "exact"))
        except ValueError as e:
            assert match in str(e), e
        else:
            raise AssertionError(f"project accepted {bad}")


def ieee_sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root (numpy's): torch's CPU ``sqrt`` (2.13, x86) is 1 ulp off for some 0.6% of
    float32 and float64 values, unlike CUDA's ``sqrt.rn``, which the kernels match."""
    return torch.from_numpy(np.sqrt(x.cpu().numpy()))


def coefficients_bitwise(device: str = "cpu") -> None:
    """The coefficient kernel's C against torch's formula on the same sums, bit for bit, in float32 and float64, each
    segment one chunk (so its sums are the given values): negative, zero and subnormal dot products and norms, zero
    denominators. Triton's float32 ``div_rn``/``sqrt_rn`` would flush the subnormals; the kernel must not."""
    for dtype in (torch.float32, torch.float64):
        tiny = torch.finfo(dtype).tiny / 8  # subnormal
        dots = torch.tensor([[1.5, -2.0, 0.0, tiny, 3.0, 7.25], [0.1, 0.2, -tiny, 5.0, 1e-3, 2.0],
                             [4.0, 1.0, 2.0, 3.0, tiny * 3, -1.0]], dtype=dtype)
        norms = torch.tensor([[2.0, 3.0, 0.0, tiny, 9.0, 0.3], [tiny, 0.7, 1.0, 0.0, 2.0, 5.5],
                              [1.0, tiny * 5, 3.0, 0.1, 4.0, 2.0]], dtype=dtype)
        tnorms = torch.tensor([1.0, 0.0, tiny, 2.5, 0.3, 7.0], dtype=dtype)
        n, segments = dots.shape
        partial = torch.stack([dots.T, norms.T], -1).contiguous().to(device)  # (P = L, N, 2)
        tpartial = tnorms.reshape(-1, 1).to(device)
        wb, scale = torch.tensor([0.2, 0.3, 0.1], dtype=dtype), torch.tensor([0.5, 1.0, 2.0], dtype=dtype)
        params = torch.cat([wb, scale, (1 - wb.sum()).reshape(1)]).to(device)
        chunks = torch.arange(segments + 1, dtype=torch.int32, device=device)
        for cosine in (False, True):
            for filter_negative in (True, False):
                coefs = torch.empty(n, segments, dtype=dtype, device=device)
                checks = torch.empty(2, n, segments, dtype=dtype, device=device)
                flag = torch.zeros(1, dtype=dtype, device=device)
                T._coef_kernel[(segments,)](partial, tpartial, chunks, params, coefs, checks, flag, segments,
                                            n_sources=n, N_STEPS=1, COSINE=cosine, FILTER=filter_negative,
                                            IEEE_F32=dtype == torch.float32, CBLOCK=T._COEF_BLOCK)
                num = dots.clamp_min(0) if filter_negative else dots
                den = ieee_sqrt(norms) * ieee_sqrt(tnorms) if cosine else norms
                factor = torch.where(den > 0, num / den, 0.0) * (scale[:, None] if cosine else 1)
                expected = wb[:, None] * factor
                assert torch.equal(coefs.cpu(), expected), (dtype, cosine, filter_negative, coefs.cpu(), expected)
                assert torch.equal(checks.cpu(), torch.stack([dots, norms])) and float(flag) == 0.0


def rules():
    """fedgp, fedgp_nofilter and fedgp_cosine with the coefficients in the kernel, through the library's CUDA code
    path on CPU tensors, against the per-segment loop (the CPU default): segments, ``out``, ``out`` = target, dicts."""
    torch.manual_seed(1)
    lengths = [300, 7, 2048 * 2 + 5, 1, 64]
    keys = [f"p{k}" for k in range(len(lengths))]
    as_dict = lambda v: dict(zip(keys, v.split(lengths)))  # noqa: E731
    for dtype in (torch.float64, torch.float32):
        S, t = torch.randn(3, sum(lengths), dtype=dtype), torch.randn(sum(lengths), dtype=dtype)
        S[1, :300] = 0  # a zero source segment
        S[2, 300:307] = -t[300:307]  # a negative projection: filtered out (kept without the filter)
        tol = {} if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
        calls = [("fedgp", dict(beta=0.4)), ("fedgp_nofilter", dict(beta=[0.2, 0.5, 0.9], weights=[1, 2, 3])),
                 ("fedgp_cosine", dict(beta=0.7, alignment=[0.5, 1.0, 2.0])),
                 ("fedgp", dict(beta=torch.tensor([0.1, 0.3, 1.0])))]
        for rule, kw in calls:
            fn = getattr(agg, rule)
            ref = fn(S, t, segments=lengths, **kw)
            with mock.patch.object(seg, "_triton", lambda s: T), mock.patch.object(agg, "LAYERWISE_BACKEND", "segmented"), \
                    mock.patch.object(agg, "LAYERWISE_COEFFICIENTS", "kernel"), \
                    mock.patch.object(T, "project", wraps=T.project) as project:
                out = torch.full_like(t, float("nan"))
                assert fn(S, t, segments=lengths, out=out, **kw) is out
                torch.testing.assert_close(out, ref, **tol)
                target = t.clone()
                fn(S, target, segments=lengths, out=target, **kw)
                torch.testing.assert_close(target, ref, **tol)
                got = fn([as_dict(r) for r in S], as_dict(t), **kw)
                torch.testing.assert_close(torch.cat([got[k] for k in keys]), ref, **tol)
                assert project.call_count == 3, project.call_count
                nan = S.clone()
                nan[2, 5] = float("nan")
                expect_error(lambda: fn(nan, t, segments=lengths, **kw), "source_grads[2]")
                huge = torch.full_like(t, torch.finfo(dtype).max / 2)
                expect_error(lambda: fn(torch.ones_like(S), huge, segments=lengths, **kw), "too large")


def flat_rules():
    """The flat form (one (N, m) tensor or N tensors of one shape, no segments) on the CUDA code path: the layer-wise
    kernels with a single segment of length m, against the CPU's flat computation (a matrix-vector product): plain,
    into ``out``, the sequence form's shape, a tensor β, and a NaN named by its source."""
    torch.manual_seed(0)
    for dtype in (torch.float64, torch.float32):
        S, t = torch.randn(3, 5000, dtype=dtype), torch.randn(5000, dtype=dtype)
        S[2] = -t  # a negative projection: filtered out (kept without the filter)
        tol = {} if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
        calls = [("fedgp", dict(beta=0.4)), ("fedgp_nofilter", dict(beta=[0.2, 0.5, 0.9], weights=[1, 2, 3])),
                 ("fedgp_cosine", dict(beta=0.7, alignment=[0.5, 1.0, 2.0])),
                 ("fedgp", dict(beta=torch.tensor([0.1, 0.3, 1.0], dtype=dtype)))]
        for rule, kw in calls:
            fn = getattr(agg, rule)
            as_sequence = lambda: (list(S.view(3, 50, 100)), t.view(50, 100))  # noqa: E731
            ref, seq_ref = fn(S, t, **kw), fn(*as_sequence(), **kw)
            with mock.patch.object(seg, "_triton", lambda s: T), mock.patch.object(agg, "LAYERWISE_BACKEND", "segmented"), \
                    mock.patch.object(T, "project", wraps=T.project) as project:
                torch.testing.assert_close(fn(S, t, **kw), ref, **tol)
                out = torch.full_like(t, float("nan"))
                assert fn(S, t, out=out, **kw) is out
                torch.testing.assert_close(out, ref, **tol)
                seq = fn(*as_sequence(), **kw)
                assert seq.shape == (50, 100), seq.shape
                torch.testing.assert_close(seq, seq_ref, **tol)
                assert project.call_count == 3, project.call_count
                nan = S.clone()
                nan[1, 7] = float("nan")
                expect_error(lambda: fn(nan, t, **kw), "source_grads[1]")


def prepared():
    """fda_core.core.prepared on the three-kernel path (the library's CUDA code path on CPU tensors): round after round,
    the buffers rewritten in place and β / the weights changing, each call equal bit for bit to the rule's own call
    (same kernels, same parameters), segments and flat, ``out`` apart and ``out`` = the target; then the CUDA-graph
    path with the capture emulated (a replay runs the captured step and refills the captured flag and checks, as a
    graph's replay refills its static outputs; nothing runs at capture), which checks that a replay reads the
    parameters of its own call; a NaN named by its source before and after the capture."""
    import fda_core.core.prepared as P

    lengths = [300, 7, 2048 * 2 + 5, 1, 64]
    calls = [dict(beta=0.4), dict(beta=[0.2, 0.5, 0.9], weights=[1, 2, 3]), dict(beta=torch.tensor([0.1, 0.3, 1.0])),
             dict(beta=1.0, weights=torch.tensor([3.0, 0.0, 1.0]))]

    def emulated_capture(step):
        captured = []  # the graph's static outputs, (flag, checks): the same tensors, refilled by every replay

        def replay():
            flag, checks = step()
            if not captured:
                captured.extend([flag.clone(), checks.clone()])
            captured[0].copy_(flag)
            captured[1].copy_(checks)

        return replay, captured  # read only after a replay, as a graph's outputs are

    gen = torch.Generator().manual_seed(2)
    every = [(lengths, False, False), (None, False, False), (lengths, False, True), (lengths, True, True),
             (None, False, True)]  # (segments, out = the target, graph)
    cases = [(torch.float64, "fedgp", every), (torch.float64, "fedgp_nofilter", every[1:2] + every[3:4]),
             (torch.float64, "fedgp_cosine", every[:1] + every[3:]), (torch.float32, "fedgp", every[2:4])]
    for dtype, rule, configs in cases:  # a subset of the combinations: each costs seconds in the interpreter
        fn = getattr(agg, rule)
        for segments, into_target, graph in configs:
            S, t = torch.empty(3, sum(lengths), dtype=dtype), torch.empty(sum(lengths), dtype=dtype)
            out = t if into_target else torch.empty_like(t)
            with mock.patch.object(seg, "_triton", lambda s: T), \
                    mock.patch.object(agg, "LAYERWISE_BACKEND", "segmented"), \
                    mock.patch.object(P, "_graphs_on", lambda device: graph), \
                    mock.patch.object(P, "_capture", emulated_capture), \
                    mock.patch.object(T, "project", wraps=T.project) as project:
                step = P.prepare(rule, S, t, out=out, segments=segments)
                assert step.path == ("graph" if graph else "kernels"), step.path
                for k, kwargs in enumerate(calls):
                    S.copy_(torch.randn(S.shape, generator=gen, dtype=dtype))
                    t.copy_(torch.randn(t.shape, generator=gen, dtype=dtype))
                    S[1, :300] = 0
                    S[2, 300:307] = -t[300:307]
                    expected = fn(S, t, out=torch.empty_like(t), segments=segments, **kwargs)
                    assert step(**kwargs) is out
                    assert torch.equal(out, expected), (rule, segments, into_target, graph, k)
                    assert step.captured == graph
                assert project.call_count == 2 * len(calls), project.call_count
                # the parameters of Python arguments equal to the last call's are not packed again; a list changed
                # in place, -0.0 for 0.0 and a tensor are
                betas = [0.2, 0.5, 0.9]
                repeats = [(betas, 1), (betas, 0), ("mutate", 1), (0.0, 1), (0.0, 0), (-0.0, 1), (torch.tensor(0.3), 1),
                           (torch.tensor(0.3), 1)]
                for beta, packed in repeats if (segments, into_target, graph) == configs[0] else []:
                    if isinstance(beta, str):
                        betas[1] = 0.1
                        beta = betas
                    expected = fn(S, t, beta, out=torch.empty_like(t), segments=segments)
                    with mock.patch.object(agg, "_python_params_host", wraps=agg._python_params_host) as host:
                        assert torch.equal(step(beta), expected), beta
                    assert host.call_count == packed, (beta, host.call_count)
                for _ in range(2):  # with the graph: before and after its capture (at the first good call)
                    S[0, 9] = float("nan")
                    expect_error(lambda: step(0.5), "source_grads[0]")  # named, also where out is the target
                    S[0, 9] = 1.0
                    t.copy_(torch.randn(t.shape, generator=gen, dtype=dtype))
                    expected = fn(S, t, 0.5, out=torch.empty_like(t), segments=segments)
                    assert torch.equal(step(0.5), expected)


def benchmark_rows():
    """benchmarks/segmented_kernels.py's rows of the three-kernel path (whole call, with its reduction launched late
    and early, with β as a host tensor, with β and the weights as tensors, and the kernels alone) run through the
    kernels here as on the device (CUDA graph capture replaced by plain calls), each giving the library's result: a
    broken row would otherwise fail first in lease time."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import segmented_kernels as bench

    lengths = [300, 5000, 64, 2000]
    torch.manual_seed(1)
    S, t = torch.randn(4, sum(lengths)), torch.randn(sum(lengths))
    out = torch.empty_like(t)
    with mock.patch.object(seg, "_triton", lambda s: T), mock.patch.object(agg, "LAYERWISE_BACKEND", "segmented"), \
            mock.patch.object(bench, "captured", lambda fn: (fn, fn())):
        reference = bench._with(None, False, lambda: agg.fedgp(S, t, bench.BETA, segments=lengths))
        rows = bench._kernel_coefficient_rows(S, t, lengths, out, reference)
        assert sorted(rows) == sorted([bench.KERNEL_COEFS, f"{bench.KERNEL_COEFS}, {bench.EARLY}",
                                       f"{bench.KERNEL_COEFS}, {bench.HOST_TENSOR}",
                                       f"{bench.KERNEL_COEFS}, {bench.ON_DEVICE}",
                                       f"{bench.KERNEL_COEFS}, {bench.PREPARED}", "project only, eager",
                                       "project only, CUDA graph replay"]), sorted(rows)
        for row, fn in rows.items():
            out.fill_(float("nan"))
            fn()
            torch.testing.assert_close(out, reference, **tolerance(torch.float32), msg=row)


def expect_error(call, text):
    try:
        call()
    except ValueError as e:
        assert text in str(e), e
    else:
        raise AssertionError(f"no ValueError mentioning {text!r}")


def compiled():
    ptx = T.compile_kernels(90)
    assert len(ptx) == 20 and all(".entry" in text and len(text) > 1000 for text in ptx.values()), list(ptx)
    # no instruction flushes subnormals to zero or approximates (torch's CUDA arithmetic does neither; Triton's float32
    # div_rn/sqrt_rn are .ftz, its / and sqrt .approx/.full)
    for name, text in ptx.items():
        inexact = sorted(set(re.findall(r"\b[a-z]+(?:\.[a-z0-9]+)*\.(?:ftz|approx|full)(?:\.[a-z0-9]+)*", text)))
        assert not inexact, (name, inexact)
    # benchmarks/kernel_code.py: a copy of the module compiles to the same instructions; a copy whose reduction
    # kernel squares the target's chunk differently differs there and only there
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import kernel_code

    source = Path(T.__file__).read_text()
    records = kernel_code.compare(kernel_code.load_source(source, "segmented_triton_copy"))
    assert all(r["same"] for r in records), [r for r in records if not r["same"]]
    line = "tl.store(tpartial + p, tl.sum(t * t, axis=0))"
    assert source.count(line) == 2  # the loop and tile reductions
    changed = kernel_code.load_source(source.replace(line, line.replace("t * t", "t * t * 2.0")), "segmented_triton_changed")
    records = kernel_code.compare(changed)
    assert {r["variant"] for r in records if not r["same"]} == {r["variant"] for r in records if "reduce" in r["variant"]}
    # Triton's launch binder binds every kernel's arguments; a copy whose coefficient kernel names an argument
    # ``params`` (the first version's, which failed on the device) is caught
    T.check_launch_binders(90)
    assert source.count("rule_values") >= 4
    shadowed = kernel_code.load_source(source.replace("rule_values", "params"), "segmented_triton_params")
    try:
        shadowed.check_launch_binders(90)
    except RuntimeError as error:
        assert "_coef_kernel" in str(error), error
    else:
        raise AssertionError("an argument named params was not caught")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        {"interpreted": lambda: (reductions_and_combination(), projection(), coefficients_bitwise(), rules(),
                                 flat_rules(), prepared(), benchmark_rows()),
         "compiled": compiled}[name]()
    print("ok")

"""fda_core.core.prepared: layer-wise FedGP bound to fixed buffers and called every round.

On the CPU a prepared call is the rule function's call, bit for bit, on the buffers' contents at the time of the call
(rewritten in place between rounds, as the federated engine does); every argument is checked when the rule is
prepared, β and the weights at each call. The three-kernel path (and its CUDA graph, emulated) runs in Triton's CPU
interpreter in tests/triton_checks.py (``prepared``, run by test_segmented.py); on a CUDA machine the graph itself is
checked here against the library's eager call.
"""

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

import fda_core.core.aggregation as agg
from fda_core.core.prepared import GRAPH_MODES, PREPARED_RULES, PreparedRule, prepare

LENGTHS = [300, 7, 2048 * 2 + 5, 1, 64]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _round(S: torch.Tensor, t: torch.Tensor, gen: torch.Generator) -> None:
    """A new round's updates written into the same buffers (a zero segment and a negative projection included)."""
    S.copy_(torch.randn(S.shape, generator=gen, dtype=S.dtype))
    t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype))
    S[1, :300] = 0
    S[2, 300:307] = -t[300:307]


CALLS = [dict(beta=0.4), dict(beta=[0.2, 0.5, 0.9], weights=[1, 2, 3]), dict(beta=torch.tensor([0.1, 0.3, 1.0])),
         dict(beta=1.0, weights=torch.tensor([3.0, 0.0, 1.0]))]


@pytest.mark.parametrize("segments", [LENGTHS, None], ids=["segments", "flat"])
@pytest.mark.parametrize("rule", sorted(PREPARED_RULES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_prepared_call_is_the_rule_on_the_buffers_contents(rule, segments, dtype):
    """Round after round, with the buffers rewritten in place and β / weights changing (Python numbers and tensors):
    the prepared call writes exactly what the rule function writes for the same arguments."""
    gen = torch.Generator().manual_seed(3)
    S, t = torch.empty(3, sum(LENGTHS), dtype=dtype), torch.empty(sum(LENGTHS), dtype=dtype)
    out = torch.full_like(t, float("nan"))
    step = prepare(rule, S, t, out=out, segments=segments)
    assert step.path == "eager" and not step.captured
    fn = getattr(agg, rule)
    for k, kwargs in enumerate(CALLS * 2):
        _round(S, t, gen)
        if rule == "fedgp_cosine" and k % 2:
            kwargs = {**kwargs, "alignment": [0.5, 1.0, 2.0]}
        assert step(**kwargs) is out
        expected = fn(S, t, out=torch.empty_like(t), segments=segments, **kwargs)
        assert torch.equal(out, expected), (k, kwargs)


def test_prepared_call_may_write_into_the_target_itself():
    gen = torch.Generator().manual_seed(5)
    S, t = torch.empty(3, sum(LENGTHS), dtype=torch.float64), torch.empty(sum(LENGTHS), dtype=torch.float64)
    step = prepare("fedgp", S, t, out=t, segments=LENGTHS)
    for beta in (0.3, 0.8):
        _round(S, t, gen)
        expected = agg.fedgp(S, t, beta, segments=LENGTHS)
        step(beta)
        assert torch.equal(t, expected)


def _buffers(n: int = 3, m: int = sum(LENGTHS)):
    return torch.randn(n, m), torch.randn(m), torch.empty(m)


@pytest.mark.parametrize("call, message", [
    (lambda S, t, o: prepare("fedavg", S, t, out=o, segments=LENGTHS), "rule must be one of"),
    (lambda S, t, o: prepare("fedgp", S, t, out=o, segments=LENGTHS, graph="yes"), "graph must be"),
    (lambda S, t, o: prepare("fedgp", S, t, out=o, segments=LENGTHS, graph=1), "graph must be"),
    (lambda S, t, o: prepare("fedgp", list(S), t, out=o, segments=LENGTHS), "source_grads must be one (N, m)"),
    (lambda S, t, o: prepare("fedgp", S[None], t, out=o, segments=LENGTHS), "source_grads must be one (N, m)"),
    (lambda S, t, o: prepare("fedgp", S, t[None], out=o, segments=LENGTHS), "target_grad must be one (m,)"),
    (lambda S, t, o: prepare("fedgp", S, t[:-1], out=o[:-1]), "target_grad has shape"),
    (lambda S, t, o: prepare("fedgp", S, t, out=None, segments=LENGTHS), "out must be an (m,) tensor"),
    (lambda S, t, o: prepare("fedgp", S, t, out=o[:-1], segments=LENGTHS), "out must be a contiguous tensor"),
    (lambda S, t, o: prepare("fedgp", S, t, out=o.double(), segments=LENGTHS), "dtype"),
    (lambda S, t, o: prepare("fedgp", S, t, out=S[0], segments=LENGTHS), "shares memory with source_grads"),
    (lambda S, t, o: prepare("fedgp", S, t, out=o, segments=LENGTHS[:-1]), "segments must sum to m"),
    (lambda S, t, o: prepare("fedgp", S, t, out=o, segments=[0] + LENGTHS), "positive integers"),
    (lambda S, t, o: prepare("fedgp", S, t, out=o, segments=LENGTHS, graph=True), "graph=True needs"),
])
def test_bad_buffers_are_named_when_the_rule_is_prepared(call, message):
    S, t, out = _buffers()
    with pytest.raises(ValueError) as error:
        call(S, t, out)
    assert message in str(error.value)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_values_are_named_at_each_call_and_the_rule_stays_usable(device):
    """β, the weights and the alignment are checked at each call as the rule function checks them; a NaN in a buffer
    names the source; after an error the next good call gives the rule's result."""
    gen = torch.Generator().manual_seed(11)
    S, t = torch.empty(3, sum(LENGTHS)), torch.empty(sum(LENGTHS))
    _round(S, t, gen)
    S, t = S.to(device), t.to(device)
    out = torch.empty_like(t)
    exact, cosine = prepare("fedgp", S, t, out=out, segments=LENGTHS), prepare("fedgp_cosine", S, t, out=out,
                                                                              segments=LENGTHS)
    for call, message in [(lambda: exact(1.5), "beta"), (lambda: exact([0.1, 0.2]), "beta"),
                          (lambda: exact(0.5, [1.0, -1.0, 1.0]), "weights"), (lambda: exact(0.5, [0, 0, 0]), "weights"),
                          (lambda: exact(0.5, alignment=[1.0, 1.0, 1.0]), "alignment"),
                          (lambda: cosine(0.5, alignment=[1.0, -2.0, 1.0]), "alignment"),
                          (lambda: exact(torch.tensor(float("nan"))), "beta")]:
        with pytest.raises(ValueError, match=message):
            call()
    for _ in range(2):  # before and after a graph is captured (CUDA)
        S[2, 5] = float("inf")
        with pytest.raises(ValueError, match=r"source_grads\[2\]"):
            exact(0.5)
        S[2, 5] = 0.0
        assert torch.equal(exact(0.5), agg.fedgp(S, t, 0.5, segments=LENGTHS, out=torch.empty_like(t)))


def test_prepared_rule_describes_itself():
    S, t, out = _buffers()
    step = prepare("fedgp_cosine", S, t, out=out, segments=LENGTHS)
    assert isinstance(step, PreparedRule)
    assert repr(step) == f"PreparedRule('fedgp_cosine', N=3, m={sum(LENGTHS)}, path='eager', captured=False)"
    assert GRAPH_MODES == ("auto", True, False)
    assert prepare("fedgp", S, t, out=out, graph=False).path == "eager"  # the CPU: no kernels, so no graph either


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rule", sorted(PREPARED_RULES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("into_target", [False, True])
def test_cuda_graph_replays_equal_the_eager_kernel_call(rule, dtype, into_target):
    """On CUDA the prepared rule captures its three kernels in a CUDA graph at the second call and replays it: every
    round equals the library's eager call on the same buffers bit for bit (same kernels, same parameters), with one
    host synchronisation per call (the finiteness flag), also when ``out`` is the target itself."""
    from fda_core.common.devices import host_synchronisations

    gen = torch.Generator().manual_seed(13)
    S, t = torch.empty(3, sum(LENGTHS), dtype=dtype), torch.empty(sum(LENGTHS), dtype=dtype)
    Sg, tg = S.cuda(), t.cuda()
    out = tg if into_target else torch.empty_like(tg)
    step = prepare(rule, Sg, tg, out=out, segments=LENGTHS)
    assert step.path == "graph"
    fn = getattr(agg, rule)
    for k, kwargs in enumerate(CALLS * 2):
        _round(S, t, gen)
        Sg.copy_(S)
        tg.copy_(t)
        expected = fn(Sg, tg, out=torch.empty_like(tg), segments=LENGTHS, **kwargs)
        if k in (4, 5):  # Python numbers, after the capture: packed, copied asynchronously, the flag read
            syncs = host_synchronisations(lambda: step(**kwargs), "cuda")
            assert syncs == 1, syncs
        else:
            step(**kwargs)
        assert step.captured
        assert torch.equal(out, expected), (k, kwargs)
    step(0.4)
    assert host_synchronisations(lambda: step(0.4), "cuda") == 1  # the same β: its parameters are on the device


_POOL = st.sampled_from([0.0, -0.0, 0.5, 1.0, 1, 0, 0.25, 2, 3.0])
_ARGUMENT = st.one_of(st.none(), _POOL, st.lists(_POOL, min_size=3, max_size=3),
                      st.lists(_POOL, min_size=3, max_size=3).map(tuple))


@settings(max_examples=300, deadline=None)
@given(first=st.tuples(_ARGUMENT, _ARGUMENT, _ARGUMENT), second=st.tuples(_ARGUMENT, _ARGUMENT, _ARGUMENT))
def test_equal_argument_keys_give_the_same_parameters_bit_for_bit(first, second):
    """A prepared call skips packing β, the weights and the alignment when their key equals the last call's: sound
    only if equal keys always give the same (2N + 1,) parameters, bit for bit (-0.0 and 0.0 apart, ints as floats)."""
    from fda_core.core.prepared import _arguments_key

    blocks = agg._normalise(torch.zeros(3, 4), torch.zeros(4), [1, 3])
    key1, key2 = _arguments_key(*first), _arguments_key(*second)
    assert key1 is not None and key2 is not None
    if key1 != key2:
        return

    def packed(arguments):
        beta, weights, alignment = arguments
        try:
            return agg._python_params_host(beta if beta is not None else 0.5, weights, alignment, blocks)
        except ValueError as error:
            return str(error).split(",")[0]

    one, two = packed(first), packed(second)
    if isinstance(one, str) or isinstance(two, str):
        assert one == two
    else:
        assert one.view(torch.int32).tolist() == two.view(torch.int32).tolist()


def test_arguments_key_leaves_tensors_bools_and_huge_ints_to_the_checks():
    from fda_core.core.prepared import _arguments_key

    assert _arguments_key(torch.tensor(0.5), None, None) is None
    assert _arguments_key(0.5, [1, torch.tensor(2.0), 3], None) is None
    assert _arguments_key(True, None, None) is None
    assert _arguments_key(0.5, [10**400, 1, 1], None) is None
    assert _arguments_key(0.5, None, None) == _arguments_key(0.5, None, None) != _arguments_key(0.5, None, [1, 1, 1])
    assert _arguments_key(0.0, None, None) != _arguments_key(-0.0, None, None)
    assert _arguments_key(1, None, None) == _arguments_key(1.0, None, None)


def test_a_failed_capture_falls_back_to_launching_the_kernels(monkeypatch):
    """graph="auto": where capturing the kernels fails (only a device can say), the call warns once and launches them
    at every call from then on, without trying to capture again; graph=True raises instead. The kernels' step is
    stubbed here (the CPU has none): what is checked is the warning, the path and the number of captures tried."""
    import fda_core.core.prepared as P

    gen = torch.Generator().manual_seed(17)
    S, t = torch.empty(3, sum(LENGTHS), dtype=torch.float64), torch.empty(sum(LENGTHS), dtype=torch.float64)
    out = torch.empty_like(t)

    tried = []

    def failing_capture(step):
        tried.append(step)
        raise RuntimeError("operation not permitted when stream is capturing")

    def as_if_on_the_kernel_path(step, graph):
        step.path, step._graph = "graph", graph
        step._blocks, step._params = agg._normalise(S, t, LENGTHS), torch.empty(7, dtype=torch.float64)
        monkeypatch.setattr(step, "_step", lambda: (torch.zeros(1, dtype=torch.float64),
                                                    torch.zeros(2, 3, len(LENGTHS), dtype=torch.float64)))
        return step

    monkeypatch.setattr(P, "_capture", failing_capture)
    step = as_if_on_the_kernel_path(prepare("fedgp", S, t, out=out, segments=LENGTHS), "auto")
    _round(S, t, gen)
    with pytest.warns(RuntimeWarning, match="capturing its kernels in a CUDA graph failed"):
        step(0.5)
    assert step.path == "kernels" and not step.captured
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(0.5)  # no second warning, no second capture
    assert len(tried) == 1
    strict = as_if_on_the_kernel_path(prepare("fedgp", S, t, out=out, segments=LENGTHS), True)
    with pytest.raises(RuntimeError, match="stream is capturing"):
        strict(0.5)

"""The workbook's methods on Flower (docs/flower.md): records and protocol, the strategy against the in-process
engine (bit-identical histories), robustness (dropped updates never reach an estimator), Flower's simulation
engine = in process, and a real loopback deployment = in process.

Needs the optional extra ``flower`` (``make setup`` installs it); without it the module is skipped.
"""

from __future__ import annotations

import json
import math
import os
import time
import tomllib
import uuid

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the optional extra 'flower' is not installed: pip install -e '.[flower]'")

from flwr.app import Array, ArrayRecord, Context, Error, Message, MessageType, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fda_core.experiments.federated import run_experiment  # noqa: E402
from fda_core.experiments.flat import FlatModel  # noqa: E402
from fda_core.experiments.flower.client_app import make_client_app  # noqa: E402
from fda_core.experiments.flower.deployment import LocalFederation, run_config_toml  # noqa: E402
from fda_core.experiments.flower.faults import Fault, parse_faults  # noqa: E402
from fda_core.experiments.flower.protocol import TrainInstruction, experiment_from_run_config  # noqa: E402
from fda_core.experiments.flower.records import BadUpdate, Layout, message_bytes, model_from_record, \
    model_to_record, parts_from_record, parts_to_record, payload_bytes  # noqa: E402
from fda_core.experiments.flower.server_app import run_strategy  # noqa: E402
from fda_core.experiments.flower.simulation import simulate_many  # noqa: E402
from fda_core.experiments.flower.strategy import FDAStrategy, FedGPStrategy, strategy_for  # noqa: E402

#: a small ColoredMNIST experiment whose FDA rounds move the target accuracy (notebook 09's setting, fewer rounds)
BASE = dict(dataset="ColoredMNIST", target="-90%", lr_decay=1.0, target_lr=1e-3, target_local_epochs=5, seed=0,
            source_fraction=0.3, warmup_rounds=1)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One torch thread, as every Flower process of these tests uses: same arithmetic (docs/flower.md § Same numbers)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _key(history):
    return [(h["round"], h["phase"], h["target_acc"], h["beta"], h["lr_source"], h["lr_target"]) for h in history]


# ------------------------------------------------------------------------------------------------
# records and protocol
# ------------------------------------------------------------------------------------------------
def _small_model():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Flatten(),
                                 torch.nn.Linear(3 * 4 * 4, 2))
    return FlatModel(module)


def test_model_record_round_trip_is_bit_identical():
    fm = _small_model()
    layout = Layout.of(fm)
    assert layout.m == fm.m == 2 * 3 * 9 + 3 + 3 + 3 + 48 * 2 + 2
    assert layout.buffer_names == ["1.running_mean", "1.running_var"]
    theta = torch.randn(fm.m)
    bufs = {"1.running_mean": torch.randn(3), "1.running_var": torch.rand(3)}
    rec = model_to_record(layout, theta, bufs)
    assert sorted(rec.keys()) == sorted(layout.param_names + layout.buffer_names)
    back, back_bufs = model_from_record(layout, rec)
    assert torch.equal(back, theta) and all(torch.equal(back_bufs[k], v) for k, v in bufs.items())
    # the per-tensor views follow the module's parameter order
    assert torch.equal(layout.as_dict(theta)["3.weight"], fm.as_dict(theta)["3.weight"])


@pytest.mark.parametrize("break_it, words", [
    (lambda a: a.__setitem__("0.weight", Array(np.full((3, 2, 3, 3), np.nan, np.float32))), "NaN"),
    (lambda a: a.__setitem__("0.weight", Array(np.zeros((4, 2, 3, 3), np.float32))), "shape"),
    (lambda a: a.__setitem__("0.weight", Array(np.zeros((3, 2, 3, 3), np.float64))), "dtype"),
    (lambda a: a.__delitem__("3.bias"), "missing ['3.bias']"),
    (lambda a: a.__setitem__("extra", Array(np.zeros(1, np.float32))), "unexpected ['extra']"),
])
def test_a_bad_model_is_refused_naming_what_is_wrong(break_it, words):
    fm = _small_model()
    layout = Layout.of(fm)
    rec = model_to_record(layout, fm.flat, fm.buffers())
    break_it(rec)
    out = torch.zeros(fm.m)
    with pytest.raises(BadUpdate, match=words.replace("[", r"\[").replace("]", r"\]")):
        model_from_record(layout, rec, out=out)
    assert not out.any()  # nothing of a bad model is written


def test_parts_must_have_the_expected_shape_and_be_finite():
    parts = torch.randn(5, 7)
    assert torch.equal(parts_from_record(parts_to_record(parts), 5, 7), parts)
    with pytest.raises(BadUpdate, match="shape"):
        parts_from_record(parts_to_record(parts), 4, 7)
    parts[2, 3] = math.inf
    with pytest.raises(BadUpdate, match="NaN or inf"):
        parts_from_record(parts_to_record(parts), 5, 7)


def test_message_sizes_count_the_arrays(monkeypatch):
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    m = 10_000
    msg = Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(m, np.float32))})}), dst_node_id=2,
                  message_type=MessageType.TRAIN)
    # payload: the .npy bytes (a 128-byte header + 4 m bytes of float32) plus the key's length (Flower's count_bytes)
    assert payload_bytes(msg) == 128 + 4 * m + len("w")
    # on the wire: the .npy bytes in one chunk object (chunks are 5 MB), plus the serialized headers of the
    # message, its RecordDict, the ArrayRecord, the Array and the chunk: a few hundred bytes
    sent = message_bytes(msg)
    assert 128 + 4 * m < sent < 128 + 4 * m + 1_000
    double = Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(2 * m, np.float32))})}), dst_node_id=2,
                     message_type=MessageType.TRAIN)
    assert message_bytes(double) - sent == 4 * m  # the headers do not grow with the array
    # the content leaves out the message's own envelope (ids, timestamps): the same for any destination
    content = message_bytes(msg, envelope=False)
    assert content == sent - len(msg.deflate())
    other = Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(m, np.float32))})}),
                    dst_node_id=2 ** 62 + 12345, message_type=MessageType.TRAIN)
    assert message_bytes(other, envelope=False) == content and message_bytes(other) > sent


def test_train_instruction_checks_name_the_field():
    ok = TrainInstruction("target", 0, 3, 1e-3, 5, 4, "labeled", True)
    assert TrainInstruction.from_config(ok.to_config()) == ok
    with pytest.raises(ValueError, match="role must be one of"):
        TrainInstruction("server", 0, 1, 1e-3, 1, 4)
    with pytest.raises(ValueError, match="lr must be"):
        TrainInstruction("source", 0, 1, 0.0, 1, 4)
    with pytest.raises(ValueError, match="a source trains on its own data"):
        TrainInstruction("source", 0, 1, 1e-3, 1, 4, "labeled")
    with pytest.raises(ValueError, match="lacks"):
        TrainInstruction.from_config({"fda.role": "source"})


def test_run_config_toml_round_trips_through_flowers_parser(tmp_path):
    from flwr.common.config import parse_config_args

    exp = {"rule": "fedgp", "rounds": 3, "target": "-90%", "method_options": {"projection": "cosine", "beta": 1.0},
           "target_lr": None, "dataset_options": {}}
    path = tmp_path / "run.toml"
    path.write_text(run_config_toml(exp, round_timeout=30.0, result_file="/tmp/x.json"))
    assert tomllib.loads(path.read_text())["round-timeout"] == 30.0
    flat = parse_config_args([str(path)])  # what `flwr run --run-config run.toml` sends
    assert set(flat) == {"experiment-json", "round-timeout", "result-file"}
    assert experiment_from_run_config(flat) == exp


def test_run_config_json_merges_over_the_declared_keys():
    rc = {"experiment.rounds": 3, "experiment.method_options.beta": 1.0, "round-timeout": 5.0,
          "experiment-json": '{"method_options": {"projection": "cosine"}, "rounds": 4}'}
    assert experiment_from_run_config(rc) == {"rounds": 4, "method_options": {"beta": 1.0, "projection": "cosine"}}
    assert experiment_from_run_config({"experiment.rule": "fedda", "experiment-json": ""}) == {"rule": "fedda"}
    with pytest.raises(ValueError, match="experiment-json"):
        experiment_from_run_config({"experiment-json": "[1, 2]"})


def test_the_app_declares_every_run_config_key_the_server_reads():
    from fda_core.experiments.flower.deployment import APP_DIR

    app = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fda_core.experiments.flower.server_app:app",
                                 "clientapp": "fda_core.experiments.flower.client_app:app"}
    declared = set(app["config"])
    assert {"experiment", "experiment-json", "round-timeout", "discovery-timeout", "num-threads", "result-file"} == declared
    from fda_core.experiments.federated import DEFAULT_CONFIG

    assert set(app["config"]["experiment"]) <= set(DEFAULT_CONFIG)


def test_parse_faults():
    assert parse_faults("nan@3, sleep@2-4:1.5,crash@*") == [Fault("nan", 3, 3), Fault("sleep", 2, 4, 1.5),
                                                            Fault("crash", None, None)]
    assert parse_faults("") == []
    for bad in ("boom@1", "nan", "nan@x", "sleep@2"):
        with pytest.raises(ValueError, match="fault entry"):
            parse_faults(bad)


def test_strategies_refuse_bad_configs_and_unsupported_methods():
    with pytest.raises(ValueError, match="after_training step"):
        strategy_for({"rule": "finetune_offline"})
    with pytest.raises(ValueError, match="runs rule 'fedgp'"):
        FedGPStrategy({"rule": "fedda"})
    with pytest.raises(ValueError, match="projection must be one of"):
        FedGPStrategy(projection="diagonal")
    with pytest.raises(ValueError, match="unknown config key"):
        FDAStrategy({"roundz": 3})
    s = FedGPStrategy({"rounds": 2}, projection="cosine", beta=1.0)
    assert s.method.display_label == "FedGP (β=1, cosine)"


# ------------------------------------------------------------------------------------------------
# the strategy and the ClientApp over an in-process grid (no Ray, no sockets): fast and exact
# ------------------------------------------------------------------------------------------------
class LocalGrid(Grid):
    """A test double of Flower's Grid: delivers each message to the ClientApp of its node in this process
    (an exception becomes an error reply, as Flower's runtimes make it). ``offline``: nodes that stop
    answering from a round on (``{node_id: round}``)."""

    def __init__(self, app, n_nodes: int, offline: dict[int, int] | None = None):
        self.app, self.offline = app, offline or {}
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={"partition-id": i, "num-threads": 1},
                                          state=RecordDict(), run_config={}) for i in range(n_nodes)}

    def set_run(self, run):  # noqa: D401 - not used
        pass

    @property
    def run(self):
        return None

    def create_message(self, *a, **k):
        raise NotImplementedError

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            nid = msg.metadata.dst_node_id
            rnd = int(msg.content["config"].get("server-round", 0))
            if nid in self.offline and rnd >= self.offline[nid]:
                continue  # gone: no reply before the timeout
            try:
                replies.append(self.app(msg, self.contexts[nid]))
            except Exception as exc:  # noqa: BLE001 - what Flower's runtimes do
                replies.append(Message(Error(code=1, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg))
        return replies


@pytest.fixture
def task_identity(monkeypatch):
    """The ServerApp's identity, as Flower's runtimes set it (messages read it)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def _local_run(cfg, faults=None, offline=None):
    grid = LocalGrid(make_client_app(faults), 3, offline)
    strategy = strategy_for(cfg, discovery_timeout=10.0)
    seen = []
    aggregate = strategy.method.aggregate

    def spy(info, res, theta):  # what the method (and its estimators) gets to see
        seen.append({"round": info.round, "sources": None if res.source_updates is None else res.source_updates.clone(),
                     "parts": None if res.target_parts is None else res.target_parts.clone(), "weights": res.weights})
        return aggregate(info, res, theta)

    strategy.method.aggregate = spy
    return run_strategy(grid, strategy, round_timeout=60.0), seen


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec", [
    {"rule": "fedgp"}, {"rule": "fedgp_auto"}, {"rule": "fedgp", "method_options": {"projection": "cosine"}},
    {"rule": "fedda"}, {"rule": "fedda_auto"}, {"rule": "source_only"}, {"rule": "target_only"},
    {"rule": "oracle", "method_options": {"epochs": 1}},
], ids=lambda s: s["rule"] + ("_cosine" if "method_options" in s and "projection" in s["method_options"] else ""))
def test_strategy_reproduces_the_in_process_engine_bit_for_bit(spec, task_identity):
    cfg = {**BASE, "rounds": 3, **spec}
    expected = run_experiment(**cfg)
    got, _ = _local_run(cfg)
    assert _key(got["history"]) == _key(expected["history"])
    assert got["final_target_acc"] == expected["final_target_acc"]
    for key in ("method", "target", "sources", "n_target_labeled", "n_target_test", "n_parameters", "config"):
        assert got[key] == expected[key], key
    assert got["flower"]["events"] == []


@pytest.mark.timeout(600)
def test_bad_updates_are_dropped_logged_and_never_reach_the_estimators(task_identity):
    cfg = {**BASE, "rounds": 6, "rule": "fedgp_auto"}
    # partitions: 0 = '+90%' (source 0), 1 = '+80%' (source 1), 2 = '-90%' (the target)
    faults = {0: "nan@2,crash@4", 1: "shape@3", 2: "crash@5"}
    got, seen = _local_run(cfg, faults=faults, offline={101: 6})  # '+80%' disconnects from round 6 on
    clean, _ = _local_run(cfg)
    ev = {(e["round"], e["env"], e["event"]) for e in got["flower"]["events"]}
    assert {(2, "+90%", "update dropped"), (3, "+80%", "update dropped"), (4, "+90%", "update dropped"),
            (5, "-90%", "update dropped"), (5, None, "round skipped"), (6, "+80%", "update dropped")} <= ev
    reasons = {(e["round"], e["env"]): e["reason"] for e in got["flower"]["events"] if e["env"]}
    assert "NaN" in reasons[(2, "+90%")] and "shape" in reasons[(3, "+80%")]
    assert "crash" in reasons[(4, "+90%")] and "timeout" in reasons[(6, "+80%")]
    # every round completed and was evaluated; round 1 (no fault yet) is the clean run's round 1
    assert [h["round"] for h in got["history"]] == list(range(1, 7))
    assert got["history"][0]["target_acc"] == clean["history"][0]["target_acc"]
    # the estimators saw only the good sources: one source in rounds 2, 3, 4 and 6, all finite
    by_round = {s["round"]: s for s in seen}
    assert 5 not in by_round  # the target failed: no aggregation, the global model kept
    for r in (2, 3, 4, 6):
        assert by_round[r]["sources"].shape[0] == 1 and torch.isfinite(by_round[r]["sources"]).all()
        assert torch.isfinite(by_round[r]["parts"]).all()
        assert by_round[r]["weights"].tolist() == [1.0]  # FedAvg weights renormalised over who answered
        assert len(got["history"][r - 1]["beta"]) == 1
    assert got["history"][4]["target_acc"] == got["history"][3]["target_acc"]  # round 5 kept round 4's model
    assert all(math.isfinite(h["target_acc"]) for h in got["history"])


def test_a_target_that_disconnects_leaves_the_model_unchanged_and_unevaluated(task_identity):
    cfg = {**BASE, "rounds": 3, "rule": "fedgp"}
    got, seen = _local_run(cfg, offline={102: 3})  # the target ('-90%', node 102) is gone from round 3 on
    assert [s["round"] for s in seen] == [1, 2]  # round 3: no aggregation
    assert math.isnan(got["history"][2]["target_acc"]) and got["final_target_acc"] != got["final_target_acc"]
    ev = {(e["round"], e["event"]) for e in got["flower"]["events"]}
    assert {(3, "update dropped"), (3, "round skipped"), (3, "evaluation failed")} <= ev


# ------------------------------------------------------------------------------------------------
# Flower's simulation engine (Ray)
# ------------------------------------------------------------------------------------------------
def test_a_simulation_whose_ray_node_did_not_start_is_started_once_more(monkeypatch, capsys):
    """Ray waits a fixed 30 s for its node; on a loaded machine the start can fail before any experiment ran (it did
    in a main job beside three busy processes). That failure, and only that, starts the simulation again, once."""
    import flwr.simulation

    from fda_core.experiments.flower import simulation as sim

    def ray_timeout() -> RuntimeError:
        try:
            try:
                raise Exception("The current node timed out during startup. This could happen because ...")
            except Exception as ex:
                raise RuntimeError("Simulation Runtime crashed.") from ex
        except RuntimeError as crashed:
            try:
                raise RuntimeError("An error was encountered. Ending simulation.") from crashed
            except RuntimeError as top:
                return top

    assert sim.ray_failed_to_start(ray_timeout())
    assert not sim.ray_failed_to_start(RuntimeError("An error was encountered. Ending simulation."))
    calls = []

    def flaky(**kwargs):  # Ray's start fails the first time; the second start runs no experiment
        calls.append(kwargs)
        if len(calls) == 1:
            raise ray_timeout()

    monkeypatch.setattr(flwr.simulation, "run_simulation", flaky)
    with pytest.raises(RuntimeError, match="without every result"):
        simulate_many([{**BASE, "rounds": 1, "rule": "fedgp"}])
    assert len(calls) == 1 + sim.RAY_START_RETRIES and calls[0]["server_app"] is not calls[1]["server_app"]
    assert "Ray did not start within its 30 s" in capsys.readouterr().out
    calls.clear()

    def always(**kwargs):
        calls.append(kwargs)
        raise ray_timeout()

    monkeypatch.setattr(flwr.simulation, "run_simulation", always)
    with pytest.raises(RuntimeError, match="Ending simulation"):
        simulate_many([{**BASE, "rounds": 1, "rule": "fedgp"}])
    assert len(calls) == 1 + sim.RAY_START_RETRIES
    calls.clear()

    def broken(**kwargs):  # any other failure is not retried
        calls.append(kwargs)
        raise RuntimeError("An error was encountered. Ending simulation.")

    monkeypatch.setattr(flwr.simulation, "run_simulation", broken)
    with pytest.raises(RuntimeError, match="Ending simulation"):
        simulate_many([{**BASE, "rounds": 1, "rule": "fedgp"}])
    assert len(calls) == 1


@pytest.mark.timeout(900)
def test_simulation_equals_in_process_for_fedgp_and_fedgp_auto():
    cfgs = [{**BASE, "rounds": 4, "rule": rule} for rule in ("fedgp", "fedgp_auto")]
    sims = simulate_many(cfgs, round_timeout=300.0)
    for cfg, sim in zip(cfgs, sims):
        ref = run_experiment(**cfg)
        assert _key(sim["history"]) == _key(ref["history"]), cfg["rule"]
        assert sim["final_target_acc"] == ref["final_target_acc"]
        assert sim["flower"]["events"] == []
        # every train/evaluate message was measured: one model each way per node and round
        m = ref["n_parameters"]
        ups = [t for t in sim["flower"]["traffic"] if t["kind"] == "train" and t["direction"] == "up"]
        assert all(t["bytes"] > 4 * m for t in ups)
    assert sims[1]["history"][-1]["beta"] is not None and len(sims[1]["history"][-1]["beta"]) == 2


@pytest.mark.timeout(900)
def test_simulation_drops_a_nan_update_and_a_client_slower_than_the_round_timeout():
    cfg = {**BASE, "rounds": 4, "rule": "fedgp_auto"}
    sim = simulate_many([cfg], faults={0: "nan@2,sleep@4:40", 1: "sleep@3:2"}, round_timeout=20.0,
                        workers=2)[0]  # two Ray workers: the sleeping node must not block the others
    ev = {(e["round"], e["env"]): e["reason"] for e in sim["flower"]["events"]}
    assert "NaN" in ev[(2, "+90%")]
    assert "timeout" in ev[(4, "+90%")]
    assert (3, "+80%") not in ev  # 2 s late is within the round timeout: waited for
    assert [len(h["beta"]) for h in sim["history"][1:]] == [1, 2, 1]
    assert all(math.isfinite(h["target_acc"]) for h in sim["history"])


# ------------------------------------------------------------------------------------------------
# a real deployment: SuperLink + 3 SuperNodes as processes on 127.0.0.1, gRPC, `flwr run`
# ------------------------------------------------------------------------------------------------
@pytest.mark.deployment
@pytest.mark.timeout(1200)
def test_loopback_deployment_equals_in_process_and_survives_a_disconnect(tmp_path):
    fed = LocalFederation(tmp_path / "federation", 3)
    try:
        fed.up()
        assert all(fed.alive(n) for n in ("superlink", "supernode-0", "supernode-1", "supernode-2"))
        assert set(fed.ports) == {"superlink-http", "fleet", "supernode-0", "supernode-1", "supernode-2"}
        for rule in ("fedgp", "fedgp_auto"):  # a warm-up round, then an FDA round (projection; auto-β from parts)
            cfg = {**BASE, "rounds": 2, "rule": rule}
            dep = fed.run(cfg, round_timeout=300.0, timeout=600.0)
            ref = run_experiment(**cfg)
            assert _key(dep["history"]) == _key(ref["history"]), rule
            assert dep["final_target_acc"] == ref["final_target_acc"]
            assert dep["flower"]["events"] == []
        # a client that disconnects mid-round: SuperNode 0 is killed once it has received its round-2 message
        cfg = {**BASE, "rounds": 2, "rule": "fedgp_auto"}
        log = fed.home / "logs" / "supernode-0.log"
        before = log.read_text().count("Receiving: train message")
        result = fed.submit(cfg, round_timeout=90.0, name="disconnect")
        deadline = time.monotonic() + 600
        while log.read_text().count("Receiving: train message") < before + 2:
            assert time.monotonic() < deadline, "SuperNode 0 never received its round-2 message"
            time.sleep(0.2)
        fed.kill_node(0)
        assert not fed.alive("supernode-0")
        dep = fed.wait(result, 600.0)
        assert [h["round"] for h in dep["history"]] == [1, 2] and math.isfinite(dep["final_target_acc"])
        events = [e for e in dep["flower"]["events"] if e["env"] == "+90%"]
        assert events and events[0]["round"] == 2 and events[0]["event"] == "update dropped"
        assert len(dep["history"][1]["beta"]) == 1  # the estimators saw the remaining source only
    finally:
        pids = dict(fed.pids)
        fed.down()
    assert pids and not any(fed.alive(n) for n in pids)
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not (tmp_path / "federation" / "federation.json").exists()
    json.dumps(dep)  # the result is JSON (it came through a file)


def test_fda_flower_command_names_a_missing_federation(tmp_path, capsys):
    from fda_core.workbook.cli import main

    assert main(["flower", "down", "--home", str(tmp_path / "none")]) == 2
    assert "no federation" in capsys.readouterr().err
    assert main(["flower", "up", "--fault", "nonsense"]) == 2  # KEY=VALUE expected: a usage error
    assert main(["flower", "up", "--home", str(tmp_path / "f"), "--dataset", "NoSuchData"]) == 2
    assert not (tmp_path / "f" / "federation.json").exists()


@pytest.mark.deployment
@pytest.mark.timeout(300)
def test_fda_flower_up_and_down_start_and_stop_the_processes(tmp_path, capsys):
    from fda_core.workbook.cli import main

    home = tmp_path / "fed"
    assert main(["flower", "up", "--home", str(home), "--nodes", "2", "--fault", "1=nan@2"]) == 0
    state = json.loads((home / "federation.json").read_text())
    assert set(state["pids"]) == {"superlink", "supernode-0", "supernode-1"}
    assert state["node_config"] == {"1": {"fault": "nan@2"}}
    assert all(LocalFederation.attach(home).alive(n) for n in state["pids"])
    assert main(["flower", "up", "--home", str(home), "--nodes", "2"]) == 2  # one federation per folder
    assert "already running" in capsys.readouterr().err
    assert main(["flower", "down", "--home", str(home)]) == 0
    assert "stopped" in capsys.readouterr().out
    for pid in state["pids"].values():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"process {pid} still running after `fda flower down`")

"""Federated methods: one interface, one registry (the engine's extension point).

A method says, like a Flower strategy, what happens in a round of federated training:

* **client side** — :meth:`Method.configure_round` says which clients train this round and how (the
  sources from the global model; the target on its labelled samples, or on its whole labelled train
  split; whether the target also records its per-batch updates, the "parts" of the auto rules), and
  :meth:`Method.local_loss` is the objective every client minimises locally (default: cross-entropy);
* **server side** — :meth:`Method.aggregate` turns what the clients sent (:class:`RoundResults`: the
  source updates g_i = h_i − h, their step counts and sample weights, the target update g_T, its
  parameters and parts, the BatchNorm statistics) into the new global model (it updates the global
  parameter vector in place, as a Flower strategy returns new parameters) and says which BatchNorm
  statistics the global model keeps; state kept between rounds lives on the method object (one
  instance per run);
* **after each round** — :meth:`Method.after_round` (optional), e.g. fine-tuning the aggregated model on
  the target within the round (the weakly-supervised FDA paper's Algorithm 1);
* **after training** — :meth:`Method.after_training` (optional), e.g. fine-tuning on the target.

The round loop (:func:`fda_core.experiments.federated.run_experiment`) knows no method by name: it asks
the method for the round's plan, trains the clients the plan names and hands the results to the method,
which updates the global model.

Every method has one canonical ``name`` (lower-case, found by name: ``get_method("fedgp_auto")``) and one
display ``label`` used by every table and figure. Variants are **options** of a method, never new names:
``get_method("fedgp", beta=1.0, projection="cosine")``; an instance's :attr:`Method.display_label`
spells its non-default options (``"FedGP (β=1, cosine)"``) and :attr:`Method.spec` its canonical
string (``"fedgp(beta=1.0, projection='cosine')"``, parsed back by :func:`parse_method_spec`).

β weights the SOURCE part everywhere (``docs/theory.md`` § Conventions): β = 0 is the target's own
update, β = 1 relies on the sources only.

Adding a method (e.g. in a notebook cell)::

    from fda_core.experiments.methods import FDAMethod, register_method
    from fda_core.core.aggregation import fedda

    @register_method
    class HalfWay(FDAMethod):
        name, label = "halfway", "Half-way FedDA"
        def combine(self, rnd, res, out):
            fedda(res.source_updates, res.target_update, 0.5, res.weights, out=out)

    run_experiment(rule="halfway", rounds=5)

or, for a server rule only, a function ``fn(rnd, res) -> update tensor (m,)`` decorated with
``@register_method("name", label="Label")``.

Modules: :mod:`.interface` (the round's messages, :class:`Method`, :class:`Option`), :mod:`.fda` (the papers'
methods), :mod:`.registry` (names, aliases, variants, labels). Import from here: every public name is
re-exported.
"""

from __future__ import annotations

from .fda import FDAMethod, FedAvg, FedDA, FedDAAuto, FedGP, FedGPAuto, FinetuneOffline, Oracle, RuleMethod, TargetOnly
from .interface import ClientInfo, Method, Option, RoundInfo, RoundPlan, RoundResults, ServerResult, TargetTraining
from .registry import (METHOD_ALIASES, VARIANTS, get_method, list_methods, method_class, method_label, paper_label,
                       parse_method_spec, register_method, with_variant)
from .registry import _REGISTRY  # noqa: F401  (for tests that register a method and remove it again)

__all__ = [
    "Option", "RoundInfo", "TargetTraining", "RoundPlan", "ClientInfo", "RoundResults", "ServerResult",
    "Method", "FedAvg", "FDAMethod", "TargetOnly", "FedDA", "FedGP", "FedDAAuto", "FedGPAuto",
    "FinetuneOffline", "Oracle", "RuleMethod",
    "register_method", "get_method", "list_methods", "method_class", "method_label", "parse_method_spec",
    "METHOD_ALIASES", "VARIANTS", "with_variant", "paper_label",
]

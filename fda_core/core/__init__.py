"""Layer 1 — maths on tensors: aggregation rules (:mod:`.aggregation`), unbiased estimators
(:mod:`.estimators`), closed-form Delta errors (:mod:`.theory`), models with known gradients
(:mod:`.known_gradients`), sympy derivations (:mod:`.symbolic`), and the Stiefel (:mod:`.stiefel`),
1-D barycenter (:mod:`.barycenter`) and Wasserstein (:mod:`.wasserstein`) maths of the translators.
Imports only :mod:`fda_core.common`."""

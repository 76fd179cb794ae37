"""Layer 3 — experiments: federated methods and the engine that runs them, the synthetic phase diagram,
estimator and Delta-error checks, Fed INB translation, and the papers' published numbers. Imports
``common``, ``core`` and ``data``."""

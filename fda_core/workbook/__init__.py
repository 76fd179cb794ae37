"""Layer 5 — workbook tooling: notebook discovery (:mod:`.discovery`), parameter types and validation
(:mod:`.parameters`), the papermill runner (:mod:`.runner`), sweeps (:mod:`.sweeps`) and the ``fda``
command (:mod:`.cli`). May import every layer."""

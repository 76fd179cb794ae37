"""Layer 4 — figures (:mod:`.plotting`, :mod:`.estimator_plots`, :mod:`.translation_plots`) and slider
widgets (:mod:`.widgets`). Imports every layer below, never ``workbook``."""

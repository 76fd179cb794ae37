"""Layer 0 — plumbing every other layer may use: atomic files and CSV notes (:mod:`.files`), the result
store (:mod:`.store`), seed streams (:mod:`.seeding`), device selection (:mod:`.devices`) and argument
checks (:mod:`.checks`). Imports nothing from the rest of ``fda_core``."""

VERSION = "0.1.0"

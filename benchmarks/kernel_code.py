"""Did a change alter the GPU code? The layer-wise Triton kernels of this checkout and of another revision compiled for
a Hopper GPU (sm_90) on the CPU, variant by variant, and their PTX instructions compared (up to the numbering of virtual registers).

GPU time is scarce (a lent device, some sessions only): a refactor of ``fda_core/core/segmented_triton.py`` that leaves
every kernel's instructions as they were cannot change its speed or its results, and this shows it without a device.
Both versions are compiled with the importable Triton (``make test`` installs one into ``.venv/triton``: run with
``PYTHONPATH=.venv/triton``) for every variant of :func:`~fda_core.core.segmented_triton.kernel_variants`. The other
revision's kernels are compiled with the same arguments, less the compile-time constants they do not have, provided
those stand at the current kernel's default (a new ``FLAG`` that defaults to off is the old kernel); otherwise the
variant is new. Compared: the PTX instructions in order, without debug information (``.loc``, ``.file``, the
``$L__tmp`` labels, the DWARF sections), with the kernel's own name normalised and the virtual registers renumbered
in order of first use (ptxas allocates the real registers anew, so register names carry no meaning).

Usage::

    PYTHONPATH=.venv/triton python benchmarks/kernel_code.py --against REV [--capability 90] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fda_core.common.files import atomic_write_json  # noqa: E402
from fda_core.core import segmented_triton  # noqa: E402

MODULE_PATH = "fda_core/core/segmented_triton.py"


def instructions(ptx: str, kernel: str) -> list[str]:
    """The PTX's instructions in order, without comments, debug information and temporary labels, with the kernel's
    name (mangled or not) replaced by ``K`` and the virtual registers renumbered in order of first use per class
    (``%r7`` → ``%r0`` …): PTX registers are names that ptxas allocates anew, so two listings that differ only in them
    are the same program."""
    body = ptx.split(".section")[0]  # the DWARF sections follow the code
    names: dict[str, str] = {}
    counts: dict[str, int] = {}

    def rename(match: re.Match) -> str:
        token, kind = match.group(0), match.group(1)
        if token not in names:
            names[token] = f"%{kind}{counts.get(kind, 0)}"
            counts[kind] = counts.get(kind, 0) + 1
        return names[token]

    kept = []
    for line in body.splitlines():
        text = line.split("//")[0].strip()
        if not text or text.startswith((".loc", ".file", "$L__tmp")):
            continue
        text = re.sub(re.escape(kernel) + r"\w*", "K", text)
        kept.append(re.sub(r"%([a-z]+)(\d+)\b", rename, text))
    return kept


def load_revision(rev: str, root: Path = ROOT) -> ModuleType:
    """``segmented_triton`` as it was at git revision ``rev``, imported under its own name from a temporary file."""
    try:
        source = subprocess.run(["git", "show", f"{rev}:{MODULE_PATH}"], cwd=root, capture_output=True, text=True,
                                check=True).stdout
    except subprocess.CalledProcessError as exc:
        raise ValueError(f"--against {rev!r}: git cannot show {MODULE_PATH} there ({exc.stderr.strip()})") from None
    return load_source(source, f"segmented_triton_at_{re.sub(r'[^0-9A-Za-z]', '_', rev)}")


def load_source(source: str, name: str) -> ModuleType:
    """A module from ``source`` (Triton reads a kernel's source from its file: it must stay on disk)."""
    folder = Path(tempfile.mkdtemp(prefix="kernel_code_"))
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _as_in(variant: segmented_triton.KernelVariant, other: ModuleType):
    """(the other version's kernel, ``variant`` as that kernel takes it), or None when it has no such variant. The
    run-time arguments are matched in order where both take as many (a renamed argument, such as the coefficient
    kernel's ``params``, now ``rule_values``), else by name."""
    fn = getattr(other, variant.kernel, None)
    if fn is None:
        return None
    theirs = set(fn.arg_names)
    current = inspect.signature(getattr(segmented_triton, variant.kernel).fn).parameters
    constexprs = {}
    for key, value in variant.constexprs.items():
        if key in theirs:
            constexprs[key] = value
        elif current[key].default is inspect.Parameter.empty or current[key].default != value:
            return None  # a constant the other version lacks, set away from its default: new behaviour
    runtime = [p.name for p in fn.params if not p.is_constexpr]
    if len(runtime) == len(variant.args):  # the same run-time arguments in order, some perhaps renamed
        args = dict(zip(runtime, variant.args.values()))
    else:
        args = {k: v for k, v in variant.args.items() if k in theirs}
    if set(args) | set(constexprs) != theirs:
        return None
    return fn, segmented_triton.KernelVariant(variant.name, variant.kernel, args, constexprs, variant.num_warps)


def compare(other: ModuleType, capability: int = 90, n_sources: int = 4) -> list[dict]:
    """One record per variant: ``variant``, ``instructions`` (this checkout), ``other_instructions`` (None when the
    other version has no such variant) and ``same`` (identical instruction lists)."""
    records = []
    for variant in segmented_triton.kernel_variants(n_sources):
        ours = instructions(segmented_triton.compile_variant(variant, capability), variant.kernel)
        matched = _as_in(variant, other)
        theirs = None
        if matched is not None:
            fn, as_theirs = matched
            theirs = instructions(segmented_triton.compile_variant(as_theirs, capability, kernel=fn), variant.kernel)
        records.append({"variant": variant.name, "instructions": len(ours),
                        "other_instructions": None if theirs is None else len(theirs),
                        "same": theirs is not None and ours == theirs})
    return records


def format_report(records: list[dict], rev: str, capability: int) -> str:
    lines = [f"layer-wise Triton kernels, this checkout vs {rev}, PTX for sm_{capability} (Triton "
             f"{getattr(segmented_triton.triton, '__version__', '?')}), instructions without debug information", "",
             f"{'variant':<44} {'here':>6} {rev[:12]:>12}  verdict", "-" * 78]
    for r in records:
        verdict = "same" if r["same"] else ("new here" if r["other_instructions"] is None else "differs")
        other = "—" if r["other_instructions"] is None else r["other_instructions"]
        lines.append(f"{r['variant']:<44} {r['instructions']:>6} {other:>12}  {verdict}")
    same = sum(r["same"] for r in records)
    lines += ["", f"{same} of {len(records)} variants compile to the same instructions as at {rev}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", required=True, metavar="REV", help="the git revision to compare with")
    p.add_argument("--capability", type=int, default=90, help="CUDA compute capability (default 90: H100/H200)")
    p.add_argument("--sources", type=int, default=4, metavar="N", help="number of sources the variants are built for")
    p.add_argument("--json", metavar="OUT", default=None)
    a = p.parse_args(argv)
    if segmented_triton.triton is None:
        p.error("Triton is not importable: run with PYTHONPATH=.venv/triton (make test installs it there)")
    if a.sources < 1:
        p.error("--sources must be >= 1")
    try:
        other = load_revision(a.against)
    except ValueError as exc:
        p.error(str(exc))
    records = compare(other, a.capability, a.sources)
    print(format_report(records, a.against, a.capability))
    if a.json:
        atomic_write_json(a.json, {"benchmark": "kernel_code", "against": a.against, "capability": a.capability,
                                   "results": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

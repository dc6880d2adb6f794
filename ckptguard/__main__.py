"""``python -m ckptguard [--strict] [--warn] [--report] script.py [args]``: run a training
script with the guard on, without editing it (``-m module`` runs a module instead).
``CKPTGUARD=strict`` (or ``1``, ``warn``, ``report``) sets the same options."""

from __future__ import annotations

import argparse
import runpy
import sys

import ckptguard


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ckptguard",
        description="Run a Python script or module with ckptguard.enable() in force.",
    )
    parser.add_argument("--strict", action="store_true", help="compare the values backward uses")
    parser.add_argument("--warn", action="store_true", help="warn instead of raising")
    parser.add_argument("--report", action="store_true", help="print per-region figures at exit")
    parser.add_argument("-m", dest="module", help="run this module as a script")
    parser.add_argument("target", nargs=argparse.REMAINDER, help="script.py and its arguments")
    args = parser.parse_args(argv)
    if args.module is None and not args.target:
        parser.error("give a script to run (or -m module)")
    options = ckptguard.options_from_environment() or {}
    if args.strict:
        options["strict"] = True
    if args.warn:
        options["on_mismatch"] = "warn"
    if args.report:
        options["report"] = True
    ckptguard.enable(**options)
    if args.module is not None:
        sys.argv = [args.module, *args.target]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args.target)
        runpy.run_path(args.target[0], run_name="__main__")


if __name__ == "__main__":
    main()

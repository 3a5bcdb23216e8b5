"""Run every benchmark module: ``python -m benchmarks [--tiny] [name ...]``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time

import benchmarks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--tiny", action="store_true", help="one quick run each (smoke test)")
    parser.add_argument("names", nargs="*", help="benchmark modules to run (default: all)")
    args = parser.parse_args(argv)
    names = args.names or sorted(
        m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.startswith("bench_")
    )
    if not names:
        print("benchmarks: none yet")
        return 0
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        start = time.perf_counter()
        print(f"== {name}{' (tiny)' if args.tiny else ''}", flush=True)
        module.main(["--tiny"] if args.tiny else [])
        print(f"== {name} finished in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

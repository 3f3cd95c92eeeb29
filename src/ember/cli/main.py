"""`ember` command line: one module per verb, each exporting add_parser(subparsers) and run(args) -> int."""
from __future__ import annotations

import argparse
import importlib
import sys

VERBS = {
    "serve": "ember.cli.serve",
    "generate": "ember.cli.generate",
    "chat": "ember.cli.generate",
    "info": "ember.cli.info",
    "bench": "ember.cli.bench",
    "make-demo-model": "ember.cli.demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ember", description="ember: a fast LLM inference engine and server")
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND")
    for module in dict.fromkeys(VERBS.values()):
        try:
            importlib.import_module(module).add_parser(sub)
        except ImportError as e:  # an optional verb whose extras are missing stays out of the list
            print(f"warning: {module} unavailable: {e}", file=sys.stderr) if "--debug" in sys.argv else None
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"ember {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

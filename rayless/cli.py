"""The ``rayless`` console script. Subcommands parse arguments and call the packages.

Each subcommand lives in its own module, imported only when used (so ``rayless status`` does
not import torch): the module has ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rayless import __version__

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("rayless.demo.main", "run the end-to-end RL pipeline on an embedded local cluster"),
    "demo-transport": ("rayless.demo_transport", "exchange tensors between two processes"),
    "status": (
        "rayless.status",
        "print a cluster's nodes, GPUs, actors, restarts (and --store NAME)",
    ),
    "debug": ("rayless.actors.api.debugger", "attach this terminal to an actor at breakpoint()"),
    "stack": ("rayless.actors.api.stack", "print every thread's Python stack of live actors"),
    "timeline": (
        "rayless.actors.api.timeline_cli",
        "write every actor's recent calls, store and weight operations as a Chrome trace",
    ),
    "job": (
        "rayless.job",
        "Ray's job commands: submit (here, or --no-wait to the cluster), logs, status, stop, "
        "list, delete",
    ),
    "dashboard": ("rayless.dashboard", "serve a live page of a running cluster (127.0.0.1)"),
    "launch": ("rayless.actors.launch.node", "start rayless on this node, torchrun-style"),
    "ssh-launch": ("rayless.actors.launch.ssh", "start rayless on many hosts over SSH"),
    "k8s": ("rayless.k8s", "write or apply the Kubernetes manifests of a job (JobSet, Job)"),
}


# Modules of the demo extra (pyproject's ``demo``): a command that needs them says so.
DEMO_EXTRA = frozenset({"yaml", "matplotlib", "transformers", "tokenizers", "safetensors"})


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser, with the chosen subcommand's arguments loaded."""
    parser = argparse.ArgumentParser(prog="rayless", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"rayless {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        cmd = sub.add_parser(name, help=help_text)
        if name in argv:  # load only the subcommand in use
            importlib.import_module(module).add_arguments(cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rayless`` command line; returns the process exit code."""
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        hint = _missing_extra(exc)
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return 2


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list[:1])
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args))


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The hint for a subcommand whose optional dependencies are not installed."""
    if exc.name in DEMO_EXTRA:
        return (
            f"rayless: this command needs {exc.name}, from the demo extra: "
            "pip install 'rayless[demo]' (or pip install -e '.[demo]' in a checkout)"
        )
    if exc.name == "kubernetes":
        return (
            "rayless: this command needs the kubernetes client, from the k8s extra: "
            "pip install 'rayless[k8s]' (or pip install -e '.[k8s]' in a checkout)"
        )
    return None


if __name__ == "__main__":
    sys.exit(main())

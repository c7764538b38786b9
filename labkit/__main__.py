"""Command line: ``python -m labkit train|estimate|plan ...`` with Megatron-LM style flags.

    python -m labkit train --world-size 4 --micro-batch-size 2 --global-batch-size 16 --train-iters 10
    torchrun --nproc-per-node 4 -m labkit train --micro-batch-size 2 --global-batch-size 16
    python -m labkit estimate --world-size 1024 --num-layers 96 ...   (Megatron's memory/FLOPs estimate)
    python -m labkit plan --help                                      (rank the layouts for a cluster)
    python -m labkit experiments list|run ID [--scale cpu] [--megatron]|report   (a tutorial's runs)
    python -m labkit train ... --save DIR --save-interval N --load DIR [--async-save]   (checkpoints)
    python -m labkit train ... --save DIR --save-interval N --max-restarts 3 [--fault 1@5]   (restarts)
    python -m labkit diverge --world-size 2 --tensor-model-parallel-size 2 --inject same_seed_tp
    python -m labkit export --load CKPT --hf OUT | --megatron OUT;  import --hf FOLDER --save CKPT
    python -m labkit fuzz --seed 0 --layouts 40 | --minutes 30 [--implementation ...] [--bug NAME]
    python -m labkit drift A.log B.log --layout-a tp=2,sp --precision bf16   (noise or bug? labkit.drift)

Notebook tooling (refresh stored outputs, student copies, grading) is ``python -m labkit.notebooks``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys


def _flag(name: str) -> str:
    return "--" + {"fp8": "fp8-format"}.get(name, name.replace("_", "-"))   # Megatron's dest fp8


def train_parser() -> argparse.ArgumentParser:
    from .config import TrainConfig
    ap = argparse.ArgumentParser(prog="python -m labkit train",
                                 description="Train the course GPT with Megatron-LM's flags.")
    ap.add_argument("--world-size", type=int, default=None,
                    help="ranks to spawn (default: WORLD_SIZE under torchrun, else 1)")
    ap.add_argument("--train-iters", "--steps", dest="steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    ap.add_argument("--log-interval", type=int, default=1)
    ap.add_argument("--implementation", default="labkit", choices=["labkit", "native", "megatron"],
                    help="labkit's strategies, the same layout through PyTorch's DTensor / FSDP2 / "
                         "pipelining APIs (labkit/native/), or through Megatron-Core itself "
                         "(labkit/megatron/, pip install -r requirements-megatron.txt)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    ap.add_argument("--verbose", action="store_true",
                    help="on a rank's failure, also print its traceback and captured output")
    ap.add_argument("--max-position-embeddings", type=int, default=None,
                    help="accepted as in Megatron; the model has --seq-length positions")
    ap.add_argument("--lr-decay-style", choices=["constant"], default="constant",
                    help="accepted as in Megatron; labkit's learning rate is constant")
    ap.add_argument("--split", choices=["100,0,0"], default="100,0,0",
                    help="accepted as in Megatron; labkit trains on the whole --data-path file")
    ap.add_argument("--save", default=None, help="checkpoint folder (labkit.checkpoint)")
    ap.add_argument("--save-interval", type=int, default=None, help="iterations between checkpoints")
    ap.add_argument("--load", default=None, help="checkpoint folder to resume from (any layout)")
    ap.add_argument("--async-save", action="store_true", help="write checkpoints in the background")
    ap.add_argument("--max-restarts", type=int, default=0,
                    help="when a rank dies: stop all, relaunch, resume from the last checkpoint in --save, "
                         "at most this many times (labkit.restart)")
    ap.add_argument("--fault", default=None,
                    help="failures on purpose, RANK@ITER[:step|save][:SIGKILL|SIGTERM|exception|hang], "
                         "comma-separated, each once (default: env LABKIT_FAULTS)")
    ap.add_argument("--collective-timeout", type=float, default=None,
                    help="seconds one collective may wait for its peers (default 600)")
    from .calc.megatron_args import FLAGS
    for f in dataclasses.fields(TrainConfig):
        if f.type in ("bool", bool):
            ap.add_argument(_flag(f.name), dest=f.name, action="store_true", default=f.default)
            for flag, (dest, kind, stored) in FLAGS.items():   # Megatron's switches that store False
                if dest == f.name and kind == "switch" and stored is False:
                    ap.add_argument("--" + flag, dest=f.name, action="store_false")
        elif f.name == "moe_layer_freq":   # an int or Megatron's pattern: parsed with num_layers known
            ap.add_argument(_flag(f.name), dest=f.name, type=str, default=f.default)
        else:
            kind = {"int": int, "float": float, "str": str}.get(str(f.type).split(" |")[0], str)
            ap.add_argument(_flag(f.name), dest=f.name, type=kind, default=f.default)
    return ap


def _exit_on_hangup() -> None:
    """SIGTERM and SIGHUP (a closed terminal, a scheduler's stop) unwind like Ctrl-C: launch's
    cleanup stops the ranks. (SIGKILL cannot be caught: the ranks' watchdogs handle that.)"""
    import signal
    import threading

    def leave(signum, frame):
        raise SystemExit(128 + signum)
    if threading.current_thread() is not threading.main_thread():
        return
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), leave)


def train_main(argv) -> int:
    from .config import TrainConfig
    from .launch_collect import LaunchTimeout, RankFailed
    from .training import train
    args = vars(train_parser().parse_args(argv))
    world = args.pop("world_size")
    if world is None:                      # not given: torchrun's WORLD_SIZE, else one rank
        world = int(os.environ.get("WORLD_SIZE", 1))
    steps, seed = args.pop("steps"), args.pop("seed")
    backend, log_interval = args.pop("backend"), args.pop("log_interval")
    timeout, verbose = args.pop("timeout"), args.pop("verbose")
    implementation = args.pop("implementation")
    max_pos = args.pop("max_position_embeddings")
    args.pop("lr_decay_style"), args.pop("split")      # what to_flags writes: labkit's only choices
    ckpt = {k: args.pop(k) for k in ("save", "save_interval", "load", "async_save", "max_restarts",
                                     "collective_timeout")}
    ckpt["faults"] = args.pop("fault")
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    config = {k: v for k, v in args.items() if v != defaults[k]}
    try:
        if isinstance(config.get("moe_layer_freq"), str):
            from .calc.moe import parse_layer_freq
            config["moe_layer_freq"] = parse_layer_freq(config["moe_layer_freq"],
                                                        config.get("num_layers", defaults["num_layers"]))
        if max_pos is not None:  # Megatron's rule, checked by the one rule book in its place
            from .calc.config import validate
            model, par = TrainConfig(**config).megatron_view(world)
            validate(model.with_(max_position_embeddings=max_pos), par)
        _exit_on_hangup()
        result = train(world_size=world, steps=steps, seed=seed, backend=backend,
                       log_interval=log_interval, timeout=timeout, implementation=implementation,
                       **ckpt, **config)
    except ValueError as e:  # a bad layout: say which rule, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RankFailed, LaunchTimeout) as e:   # one line; the whole story under --verbose
        print(f"error: {e.summary if isinstance(e, RankFailed) else str(e).splitlines()[0]}"
              f"{'' if verbose else ' (--verbose: traceback and output)'}", file=sys.stderr)
        if verbose:
            print(e.details() if isinstance(e, RankFailed) else str(e), file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", 0)) == 0:
        if result.goodput is not None:
            g = result.goodput
            print(f"restarts: {g['restarts']} | goodput: {100 * g['goodput']:.1f}% | recomputed: "
                  f"{g['recomputed_s']:.2f} s | save blocking: {g['save_blocking_s']:.2f} s | "
                  f"restart: {g['restart_s']:.2f} s | wall: {g['wall_s']:.2f} s")
        print(f"final lm loss: {result.losses[-1]:.6f}")
    return 0


def _gpu_check(argv) -> int:
    from .gpu_check import main as gpu_check_main   # run the GPU plan, write a report
    return gpu_check_main(argv)


def _experiments(argv) -> int:
    from .experiments.cli import main as experiments_main   # a Megatron-LM tutorial's runs, by name
    return experiments_main(argv)


def _diverge(argv) -> int:
    from .debug.cli import main as diverge_main   # the first divergence from one device (labkit.debug)
    return diverge_main(argv, train_parser)


def _interop(name):
    def run(argv) -> int:   # labkit.interop: Hugging Face / Megatron-Core folders in and out
        from .interop import cli
        return getattr(cli, name)(argv)
    return run


def _fuzz(argv) -> int:
    from .fuzz.cli import main as fuzz_main   # random layouts against one device (labkit.fuzz)
    return fuzz_main(argv)


def _drift(argv) -> int:
    from .drift.cli import main as drift_main   # noise or bug: the measured envelopes (labkit.drift)
    return drift_main(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": train_main, "gpu-check": _gpu_check, "experiments": _experiments, "diverge": _diverge,
                "export": _interop("export_main"), "import": _interop("import_main"), "fuzz": _fuzz,
                "drift": _drift}
    try:
        from .calc import cli as calc_cli
        commands["estimate"] = calc_cli.main
        if hasattr(calc_cli, "plan_main"):
            commands["plan"] = calc_cli.plan_main
    except ImportError:
        pass
    if not argv or argv[0] not in commands:
        print(f"usage: python -m labkit {{{','.join(commands)}}} [flags]   (--help after a command)",
              file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())

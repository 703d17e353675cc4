"""`tvmnorm tune | build | list | bench` (arguments are parsed in main(), never at import)."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

from .key import DTYPES, FORWARD_STAGES, FP8, NORMS, STAGES, NormKey
from .shapes import hidden_sizes, parse_hidden

REPO = pathlib.Path(__file__).resolve().parent.parent


def _csv(s):
    return [v.strip() for v in s.split(",") if v.strip()]


def at_least_one(text):
    """argparse type of a count that must be positive (trials, rows, batch, workers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def writable_dir(path, flag: str) -> pathlib.Path:
    """``path`` as a folder this process can make or write in (made later by the work itself;
    nothing is left behind here), else SystemExit naming ``flag`` and the reason. Checked before
    the work whose results go there: a bench that could not save its results failed only after
    timing every case."""
    p = pathlib.Path(path)
    base = p
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise SystemExit(f"{flag}: {base} is a file, not a folder")
    try:  # a real write: os.access says yes to root where the file system says no (/proc)
        os.rmdir(tempfile.mkdtemp(prefix=".tvmnorm-probe-", dir=base))
    except OSError as e:
        raise SystemExit(f"{flag}: cannot write in the folder {base}: {e.strerror or e}") from None
    return p


def _chunk_rows(s):
    """--chunk-rows: T values, or "all" (every size the bwd design space is built for)."""
    from .compute.norms import CUDA_CHUNK_ROWS
    if s.strip() == "all":
        return list(CUDA_CHUNK_ROWS)
    try:
        return [int(v) for v in _csv(s)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected T values like 16,32 or 'all', got {s!r}") from None


# what keys_from_args takes for an option of add_key_args left out (its help says the same)
DEFAULT_NORMS = "rmsnorm,layernorm"
DEFAULT_DTYPES = "bf16"


def add_key_args(p, stages_default="fwd,bwd"):
    """Options that select a set of keys: shapes from the catalog or hidden sizes named directly.
    --norms, --stages and --dtypes default to None (see keys_from_args), so that names_keys can
    tell a selection given from the defaults."""
    opts = [
        p.add_argument("--shapes", default=None, help="catalog groups, e.g. deepseek,qwen,qknorm or all"),
        p.add_argument("--hidden", default=None, help="hidden sizes, e.g. 768,4096 (instead of --shapes)"),
        p.add_argument("--norms", default=None, help=f"rmsnorm,layernorm (default: {DEFAULT_NORMS})"),
        p.add_argument("--stages", default=None, help=f"fwd,bwd,bwd_add,fwd_add (default: {stages_default})"),
        p.add_argument("--dtypes", default=None,
                       help=f"itype=wtype=otype for each, e.g. bf16,fp16,fp32 (default: {DEFAULT_DTYPES})"),
        p.add_argument("--fp8", default=None, choices=FP8,
                       help="also fp8-output keys of the forward stages with this otype"),
        p.add_argument("--fp8-only", action="store_true",
                       help="with --fp8: its fp8-output keys alone, without the --dtypes keys they ride with"),
        p.add_argument("--zero-centered-gamma", action="store_true", help="keys with zero-centred gamma"),
        p.add_argument("--keys", default=None, help="packed keys (decimal or 0x hex), comma separated"),
    ]
    p.set_defaults(stages_default=stages_default, key_dests=tuple(o.dest for o in opts))


def add_layouts_arg(p):
    """--layouts: x's layouts a library holds kernels for (build.X_LAYOUTS)."""
    from .build import checked_layouts

    def layouts(text):
        try:
            return checked_layouts(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    p.add_argument("--layouts", type=layouts, default="all",
                   help="x's layouts the library holds kernels for, a module each: compact (rows hidden apart), "
                        "strided (rows at one stride: x[..., :hidden] of a wider tensor), heads (per-head rows "
                        "of a fused qkv), or all (default: all, so that no layout needs TVM's compiler at run "
                        "time; compact alone builds a third of the code)")


def _packed_key(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise ValueError(f"{text!r} is not a packed key (a decimal or 0x-hex integer)") from None


def keys_from_args(args) -> list:
    try:
        if args.keys:
            return [NormKey.unpack(_packed_key(k)) for k in _csv(args.keys)]
        hiddens = parse_hidden(args.hidden) if args.hidden else hidden_sizes(args.shapes or "all")
    except ValueError as e:
        raise SystemExit(f"--keys: {e}" if args.keys else str(e)) from None
    norms = _csv(args.norms or DEFAULT_NORMS)
    stages = _csv(args.stages or args.stages_default)
    dtypes = _csv(args.dtypes or DEFAULT_DTYPES)
    if set(dtypes) & set(FP8):
        raise SystemExit(f"--dtypes {','.join(dtypes)}: fp8 is only an output type; "
                         f"select fp8-output keys with --fp8 {'|'.join(FP8)}")
    for name, vals, allowed in (("norm", norms, NORMS), ("stage", stages, STAGES), ("dtype", dtypes, DTYPES)):
        bad = [v for v in vals if v not in allowed]
        if bad:
            raise SystemExit(f"unknown {name} {bad}; choose from {allowed}")
    if args.fp8_only and not args.fp8:
        raise SystemExit(f"--fp8-only selects the keys of --fp8: name its otype (--fp8 {'|'.join(FP8)})")
    if args.fp8_only and not set(stages) & set(FORWARD_STAGES):
        raise SystemExit(f"--fp8-only: fp8 output exists at the forward stages {FORWARD_STAGES} alone, "
                         f"not at {','.join(stages)}")
    keys = []
    for h in hiddens:
        for norm in norms:
            for stage in stages:
                for dt in ([] if args.fp8_only else dtypes):
                    keys.append(NormKey(norm=norm, stage=stage, itype=dt, wtype=dt, otype=dt, hidden_size=h,
                                        zero_centered_gamma=args.zero_centered_gamma))
                if args.fp8 and stage in FORWARD_STAGES:
                    for dt in dtypes:
                        keys.append(NormKey(norm=norm, stage=stage, itype=dt, wtype=dt, otype=args.fp8,
                                            hidden_size=h, zero_centered_gamma=args.zero_centered_gamma))
    return list(dict.fromkeys(keys))


def names_keys(args) -> bool:
    """Whether any option of add_key_args was given, rather than all left at their defaults."""
    return any(getattr(args, name) for name in args.key_dests)


def check_arch(keys, target: str) -> None:
    """Stops before any compile, naming the arch, where this GPU (or TVMNORM_CUDA_ARCH) cannot
    run ``keys``' CUDA kernels: nvcc's errors would say it far less clearly."""
    if target == "cuda":
        from .targets import cuda_arch
        try:
            cuda_arch(fp8=any(k.fp8_out for k in keys))
        except ValueError as e:
            raise SystemExit(str(e)) from None


def _records_for(kind, root=None):
    """The records of ``kind`` in a --schedules directory (None: the committed schedules/); one
    that is not there is a typo to stop at, not a build of default schedules only."""
    from .tune import records_or_stop
    if root is not None and not pathlib.Path(root).is_dir():
        raise SystemExit(f"--schedules {root}: no such directory")
    return records_or_stop(kind, root)


def library_out(args) -> pathlib.Path:
    """--out of build and tune (default: the package's library), checked before any work: a
    build replaces the folder whole."""
    from .build import check_out_dir
    from .runtime import DEFAULT_LIBRARY_ROOT
    out = pathlib.Path(args.out) if args.out else DEFAULT_LIBRARY_ROOT / args.target
    try:
        check_out_dir(out)
    except ValueError as e:
        raise SystemExit(f"--out: {e}") from None
    writable_dir(out.parent, "--out")  # the build is written beside it, then moved in
    return out


def use_arch(args) -> None:
    """--arch of build and list --records: the CUDA GPU whose records (schedules/cuda-<arch>.json)
    and kernels the command is for."""
    if not args.arch:
        return
    if args.target != "cuda":
        raise SystemExit(f"--arch is a CUDA GPU's (sm_80, sm_90, ...); --target is {args.target}")
    from .targets import checked_cuda_arch
    try:
        checked_cuda_arch(args.arch, "--arch")
    except ValueError as e:
        raise SystemExit(str(e)) from None
    # the variable, not an argument threaded through: the records' file, the build and the
    # manifest all follow it, as they do when a user sets it
    os.environ["TVMNORM_CUDA_ARCH"] = args.arch


def add_arch_arg(p, what: str = "the GPU to build for") -> None:
    p.add_argument("--arch", default=None,
                   help=f"CUDA: {what}, e.g. sm_80 (default: $TVMNORM_CUDA_ARCH, else this "
                        "machine's GPU, else sm_90); its records are schedules/cuda-<arch>.json")


def cmd_build(args):
    from .build import build_library
    from .tune import schedules_path
    use_arch(args)
    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"--jobs must be at least 1, got {args.jobs}")
    keys = keys_from_args(args)
    records = {} if args.no_tuned else _records_for(args.target, args.schedules)
    if args.schedules is not None and not args.no_tuned and not records:
        print(f"no records in {schedules_path(args.target, args.schedules)}: building the default schedules",
              file=sys.stderr)
    if args.tuned_only:
        # the keys named that have a record; with none named, every record of the file
        named = names_keys(args)
        keys = [k for k in keys if k.pack() in records] if named else [NormKey.unpack(p) for p in records]
        if not keys:
            which = "none of the keys named has a" if named else "there is no"
            raise SystemExit(f"--tuned-only: {which} tuned record in {schedules_path(args.target, args.schedules)}"
                             + (" (--no-tuned reads none)" if args.no_tuned else ""))
    # on the keys to be built: --tuned-only's may hold fp8 keys the selection did not, or lose them
    check_arch(keys, args.target)
    build_library(keys, args.target, library_out(args), records=records, jobs=args.jobs, layouts=args.layouts)


def list_records(args) -> None:
    """The records a build of ``args.target`` takes (schedules/<target-arch>.json), a line a key:
    what a GPU's tune chose can be read on a machine without that GPU or a library."""
    from .tune import schedules_path
    use_arch(args)
    path = schedules_path(args.target, args.schedules)
    records = _records_for(args.target, args.schedules)
    if not records:
        raise SystemExit(f"no records in {path}")
    print(f"# {path}: {len(records)} records")
    for packed, rec in sorted(records.items()):
        k = NormKey.unpack(packed)
        zc = ", zero_centered_gamma" if k.zero_centered_gamma else ""
        chunk = f", T={rec['rows_per_partial']}" if rec.get("rows_per_partial") else ""
        # the search's time of each part's kernel at the rows it tuned at (a record that lost to
        # the default in its library, and took the default's schedule, keeps none)
        timed = "".join(f", {part} {us:.1f} us" for part, us in sorted(rec.get("run_us", {}).items()))
        won = ": the default rule's schedule" if rec.get("default_won") else ""
        # why a tuned record gave way to the default's, and the same-machine A/B that let a record
        # in on another GPU than the one it was timed on (bench/results/h200-run51/ab_accept.py)
        lost = f"; the tuned one was {rec['lost_in_library']}" if rec.get("lost_in_library") else ""
        ab = rec.get("accepted_ab")
        adopted = (f"; adopted on an A/B on the {ab['device']}: {min(ab['old_us']):.1f} -> {min(ab['new_us']):.1f} us"
                   if ab else "")
        print(f"{packed:#014x}  {k.norm:9s} {k.stage:7s} {k.describe()}{zc}  "
              f"[{rec.get('trials', 0)} trials at {rec.get('rows')} rows{chunk}{timed}{won}{lost}{adopted}]")


def cmd_list(args):
    if args.records:
        return list_records(args)
    if args.schedules or args.arch:
        raise SystemExit("--schedules and --arch pick the records `tvmnorm list --records` lists; "
                         "a library's manifest names its own arch")
    from .build import MANIFEST
    from .runtime import default_library_path
    path = pathlib.Path(args.library) if args.library else default_library_path(args.target)
    mf = path / MANIFEST
    if not mf.exists():
        raise SystemExit(f"no library at {path} (run `tvmnorm build --target {args.target}` first, "
                         "or `tvmnorm list --records` for the tuned records a build takes)")
    manifest = json.loads(mf.read_text())
    # a CUDA library's later kernels of a call launch with programmatic dependent launch unless
    # it was built with TVMNORM_PDL=0 (libraries built before the flag do not say)
    pdl = f" pdl={'on' if manifest['pdl'] else 'off'}" if manifest["target"] == "cuda" and "pdl" in manifest else ""
    print(f"# {path}: target={manifest['target']} arch={manifest['arch']} tvm={manifest['tvm_version']} "
          f"ffi={manifest['ffi_version']} source={manifest['tvmnorm_source_hash']} "
          f"sha256={manifest['sha256'][:12]}{pdl}")
    for e in manifest["kernels"]:
        k = NormKey.unpack(int(e["key"]))
        zc = ", zero_centered_gamma" if k.zero_centered_gamma else ""
        # T: the rows per dgamma partial of a backward kernel (the runtime sizes the partials by it)
        chunk = f", T={e['rows_per_partial']}" if e.get("rows_per_partial") else ""
        won = ": the default rule's schedule measured fastest" if e.get("default_won") else ""
        print(f"{int(e['key']):#014x}  {k.norm:9s} {k.stage:7s} {k.describe()}{zc}  [{e['origin']}{chunk}{won}]")
    for layout, info in manifest.get("layouts", {}).items():
        tuned = sum(e.get("layouts", {}).get(layout, {}).get("origin") == "tuned" for e in manifest["kernels"])
        print(f"# x layout {layout}: {info['library']} sha256={info['sha256'][:12]}, {tuned} keys from their records")


def tune_folders(args) -> None:
    """--logs and --schedules of tune, checked writable: by default the repository's
    tuning_logs/ and schedules/, its committed data. A tvmnorm installed from a wheel has no
    repository (its records are a copy inside the package, which tune must not rewrite): there
    both must be named."""
    from .tune import CHECKOUT_SCHEDULES
    for flag, name in (("--logs", "tuning_logs"), ("--schedules", "schedules")):
        attr = flag[2:]
        if getattr(args, attr) is None:
            if not CHECKOUT_SCHEDULES.is_dir():
                raise SystemExit(f"tune: name {flag} DIR: this tvmnorm is installed without its repository "
                                 f"(no {CHECKOUT_SCHEDULES}), whose {name}/ tune writes by default")
            setattr(args, attr, str(REPO / name))
        writable_dir(getattr(args, attr), flag)


def cmd_tune(args):
    from .tune import tune_main
    keys = keys_from_args(args)
    check_arch(keys, args.target)
    tune_folders(args)
    # checked now, not after the search
    tune_main(args, keys, None if args.no_build else library_out(args))


def cmd_bench(args):
    from .bench import bench_main
    bench_main(args)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="tvmnorm", description="RMSNorm/LayerNorm kernels generated and tuned by Apache TVM.")
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("tune", help="tune keys with MetaSchedule and build the library")
    p.add_argument("--target", choices=("llvm", "cuda"), default="llvm")
    add_key_args(p)
    p.add_argument("--trials", type=at_least_one, default=64, help="measured candidates per key")
    p.add_argument("--logs", default=None, help="raw MetaSchedule databases (default: the repository's tuning_logs/)")
    p.add_argument("--schedules", default=None, help="chosen records per target (default: the repository's schedules/)")
    p.add_argument("--rows", type=at_least_one, default=None, help="row count to tune at (default: per target)")
    p.add_argument("--no-build", action="store_true", help="do not build the library afterwards")
    p.add_argument("--out", default=None, help="library directory (default: the package's)")
    add_layouts_arg(p)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=at_least_one, default=8, help="keys per MetaSchedule session")
    p.add_argument("--build-workers", type=at_least_one, default=None,
                   help="processes compiling candidates (default: one per core)")
    p.add_argument("--min-trials", type=at_least_one, default=None,
                   help="take a key's best candidate from the database of an interrupted run once "
                        "every task has this many (default: --trials); the key stays due for more")
    p.add_argument("--overlap-builds", action="store_true",
                   help="compile candidates while the search draws the next tasks' (no faster on the H200: 49.6 vs 49.5 s a key)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="start no batch with less than half its time left before this many seconds from "
                        "the start (at the seconds a key has taken so far, or --key-seconds); its keys stay due")
    p.add_argument("--key-seconds", type=float, default=None,
                   help="with --time-limit, what a key takes before this run has timed one")
    p.add_argument("--recover-only", action="store_true",
                   help="only take records from the databases (see --min-trials) and build; tune nothing")
    p.add_argument("--chunk-rows", type=_chunk_rows, default=None,
                   help="rows per dgamma partial (T) to tune the CUDA bwd kernel at, e.g. 16,32, or all "
                        "(default: the default rule's T for the key and its record's where that differs; "
                        "each T is its own task)")
    p.add_argument("--sweep-chunk-rows", action="store_true",
                   help="CUDA backward and backward-with-add: after the search, time each key's dx record and "
                        "finalize at T = 8-64 (multiples of 8; needs torch and a CUDA GPU) and keep the fastest T "
                        "where it is over 5%% faster than its own; each key is saved as it is swept, and keys "
                        "swept already are passed over (a run cut off resumes)")
    p.add_argument("--sweep-again", action="store_true",
                   help="with --sweep-chunk-rows: sweep the records that hold a sweep too (after a driver or "
                        "GPU change, say), from the T they hold")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("build", help="compile keys into a library with a manifest")
    p.add_argument("--target", choices=("llvm", "cuda"), default="llvm")
    add_key_args(p)
    p.add_argument("--out", default=None, help="library directory (default: the package's)")
    add_layouts_arg(p)
    p.add_argument("--no-tuned", action="store_true", help="ignore schedules/ (default schedules only)")
    p.add_argument("--tuned-only", action="store_true", help="only the keys that have tuned records")
    p.add_argument("--schedules", default=None,
                   help="directory of <target-arch>.json records (default: the committed schedules/)")
    p.add_argument("--jobs", type=int, default=None,
                   help="CUDA: nvcc processes at once, one .cu each (default: the usable cores)")
    add_arch_arg(p)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("list", help="list the keys in a library, or (--records) the tuned records a build takes")
    p.add_argument("--target", choices=("llvm", "cuda"), default="llvm")
    p.add_argument("--library", default=None, help="library directory")
    p.add_argument("--records", action="store_true",
                   help="list the tuned records of <schedules>/<target-arch>.json instead (no library needed): "
                        "trials, rows tuned at, T and the search's time of each key")
    p.add_argument("--schedules", default=None,
                   help="with --records: directory of <target-arch>.json records (default: the committed schedules/)")
    add_arch_arg(p, "with --records: the GPU whose records to list")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("bench", help="benchmark tvmnorm against peers and the copy roofline")
    try:
        from .bench import add_bench_args
        add_bench_args(p)
    except ImportError:
        pass
    p.set_defaults(func=cmd_bench)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except BrokenPipeError:
        # `tvmnorm list ... | head`: the reader has gone; say nothing more (Python's recipe: point
        # stdout at devnull so that the interpreter's final flush does not raise again)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

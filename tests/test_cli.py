"""`python -m tvmnorm build` then `python -m tvmnorm list`: the smoke test of the CLI."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import has_nvcc
from tvmnorm.build import LIBRARY, MANIFEST, RECORDS
from tvmnorm.key import NormKey
from tvmnorm.targets import no_gpu_device_node

KEY = NormKey(norm="rmsnorm", stage="fwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=128)
BUILD = ["build", "--target", "llvm", "--hidden", "128", "--norms", "rmsnorm", "--stages", "fwd",
         "--dtypes", "fp32"]


def tvmnorm_cli(*args):
    res = subprocess.run([sys.executable, "-m", "tvmnorm", *args], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ))
    assert res.returncode == 0, f"tvmnorm {' '.join(args)} failed ({res.returncode}):\n{res.stderr[-3000:]}"
    return res.stdout


def build_and_list(out, *extra, layouts=("strided", "heads")):
    """Build, then list; ``layouts``: x's other layouts the library should hold (the default: all)."""
    tvmnorm_cli(*BUILD, "--out", str(out), *extra)
    manifest = json.loads((out / MANIFEST).read_text())
    # the records the kernels were built from, where any key had one (build.RECORDS)
    tuned = any(e["record"] for e in manifest["kernels"])
    modules = [f"libtvmnorm.{layout}.so" for layout in layouts]
    assert [i["library"] for i in manifest["layouts"].values()] == modules
    assert sorted(p.name for p in out.iterdir()) == sorted([LIBRARY, MANIFEST, *modules] + [RECORDS] * tuned)
    assert [e["key"] for e in manifest["kernels"]] == [KEY.pack()]
    listing = tvmnorm_cli("list", "--library", str(out)).splitlines()
    assert listing[0].startswith(f"# {out}: target=llvm"), listing
    assert [ln.split(":")[0] for ln in listing if ln.startswith("# x layout")] == [f"# x layout {lay}" for lay in layouts]
    lines = [ln for ln in listing[1:] if ln.strip() and not ln.startswith("# x layout")]
    assert len(lines) == 1, listing
    return manifest["kernels"][0]["origin"], lines[0]


def test_build_then_list_no_tuned(tmp_path):
    origin, line = build_and_list(tmp_path / "lib", "--no-tuned")
    assert origin == "default"
    assert line.startswith(f"{KEY.pack():#014x}"), line
    assert "rmsnorm" in line and "fwd" in line
    assert "hidden_size=128, wtype=fp32, itype=fp32, otype=fp32, ctype=fp32" in line, line
    assert line.endswith("[default]"), line


@pytest.mark.slow
def test_build_layouts_named(tmp_path):
    """--layouts picks x's layouts the library holds (compact always); an unknown one is refused by name."""
    origin, line = build_and_list(tmp_path / "lib", "--no-tuned", "--layouts", "heads", layouts=("heads",))
    assert origin == "default" and line.endswith("[default]"), line
    build_and_list(tmp_path / "lib", "--no-tuned", "--layouts", "compact", layouts=())
    res = subprocess.run([sys.executable, "-m", "tvmnorm", *BUILD, "--layouts", "compact,rows", "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 2 and "unknown x layout 'rows'" in res.stderr, res.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(importlib.util.find_spec("tvmnorm.tune") is None, reason="tvmnorm.tune not written yet")
def test_build_then_list_with_tuned_records(tmp_path):
    """Without --no-tuned, build reads the committed records; the key is listed with whichever
    origin the records give it."""
    from tvmnorm.tune import load_records
    expected = "tuned" if KEY.pack() in load_records("llvm") else "default"
    origin, line = build_and_list(tmp_path / "lib")
    assert origin == expected and line.endswith(f"[{expected}]"), line
    assert "hidden_size=128, wtype=fp32, itype=fp32, otype=fp32, ctype=fp32" in line


def test_list_without_library_fails_clearly(tmp_path):
    res = subprocess.run([sys.executable, "-m", "tvmnorm", "list", "--library", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "no library" in res.stderr


def test_list_records_reads_a_gpus_records_without_the_gpu_or_a_library(tmp_path, capsys, monkeypatch):
    """`tvmnorm list --records`: a line a record of schedules/<target-arch>.json, with its trials,
    rows, T, the search's time, whether it is the default rule's schedule and why (the tuned
    record's loss in its library), and the A/B that adopted it, on a machine with neither that
    GPU nor a built library; --arch and --schedules pick the file."""
    from tvmnorm.cli import main
    from tvmnorm.tune import read_records, save_records, schedules_path
    monkeypatch.setenv("TVMNORM_CUDA_ARCH", "sm_90")  # --arch sets it; undone after the test
    committed = read_records(schedules_path("cuda"))
    main(["list", "--records", "--target", "cuda", "--arch", "sm_90"])
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.endswith(f"cuda-sm_90.json: {len(committed)} records")
    assert [int(ln.split()[0], 16) for ln in lines] == sorted(committed)
    # one tuned backward record, one the default rule's schedule since its tuned one lost in the
    # library, and one adopted on an A/B, listed from another folder
    bwd = next(k for k, r in committed.items() if r.get("rows_per_partial") and r.get("run_us")
               and not r.get("accepted_ab"))
    won = next(k for k, r in committed.items() if r.get("default_won") and r.get("lost_in_library"))
    ab = next(k for k, r in committed.items() if r.get("accepted_ab"))
    save_records("cuda", {k: committed[k] for k in (bwd, won, ab)}, tmp_path)
    main(["list", "--records", "--target", "cuda", "--arch", "sm_90", "--schedules", str(tmp_path)])
    _, *shown = capsys.readouterr().out.splitlines()
    listed = {int(ln.split()[0], 16): ln for ln in shown}
    assert sorted(listed) == sorted((bwd, won, ab))
    why, test = committed[won]["lost_in_library"], committed[ab]["accepted_ab"]
    assert listed[won].endswith(f": the default rule's schedule; the tuned one was {why}]")
    assert listed[ab].endswith(f"; adopted on an A/B on the {test['device']}: {min(test['old_us']):.1f} -> "
                               f"{min(test['new_us']):.1f} us]")
    rec = committed[bwd]
    assert NormKey.unpack(bwd).describe() in listed[bwd]
    assert (f"[{rec['trials']} trials at {rec['rows']} rows, T={rec['rows_per_partial']}, "
            f"dx {rec['run_us']['dx']:.1f} us]") in listed[bwd]
    assert "default rule" not in listed[bwd] and "adopted" not in listed[bwd]
    with pytest.raises(SystemExit, match="no records in .*cuda-sm_80.json"):
        main(["list", "--records", "--target", "cuda", "--arch", "sm_80", "--schedules", str(tmp_path)])
    assert "building" not in capsys.readouterr().err  # build's word on an empty --schedules is build's
    with pytest.raises(SystemExit, match="--arch is a CUDA GPU's"):
        main(["list", "--records", "--target", "llvm", "--arch", "sm_90"])
    with pytest.raises(SystemExit, match="no library at .*or `tvmnorm list --records`"):
        main(["list", "--target", "cuda", "--library", str(tmp_path)])
    with pytest.raises(SystemExit, match="--schedules and --arch pick the records `tvmnorm list --records`"):
        main(["list", "--target", "cuda", "--arch", "sm_90"])


@pytest.mark.skipif(not no_gpu_device_node(), reason="a machine with a GPU asks it for its arch through TVM")
def test_list_records_of_cuda_on_a_machine_without_a_gpu_does_not_import_tvm():
    """`tvmnorm list --records --target cuda` where there is no GPU (no NVIDIA device node):
    the arch is the default one (targets.cuda_arch), known without TVM, whose import took ~4 of
    the command's ~4.5 s; what it lists is the committed sm_90 records."""
    code = ("import sys; from tvmnorm.cli import main; main(['list', '--records', '--target', 'cuda']); "
            "print('imported tvm' if 'tvm' in sys.modules else 'no tvm')")
    env = {k: v for k, v in os.environ.items() if k != "TVMNORM_CUDA_ARCH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    header, *_, last = out.splitlines()
    assert re.search(r"/schedules/cuda-sm_90\.json: \d+ records$", header), header
    assert last == "no tvm"


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="the CPU's name is kept by its /proc/cpuinfo fields")
def test_list_records_of_llvm_imports_tvm_once_a_cpu(tmp_path):
    """`tvmnorm list --records --target llvm`: LLVM's name of the CPU (the records' file,
    schedules/llvm-<cpu>.json) is asked of TVM the first time and kept under TVMNORM_CACHE, so a
    later run lists the same file without importing TVM (~4 s); a kept name that is not one is
    asked again and replaced; an unwritable cache costs only the import."""
    from tvmnorm._tvm import llvm_system_cpu
    # records filed under this machine's CPU, whatever it is (the committed ones are a Zen 5's)
    schedules = tmp_path / "schedules"
    schedules.mkdir()
    committed = pathlib.Path(__file__).parent.parent / "schedules" / "llvm-znver5.json"
    shutil.copy(committed, schedules / f"llvm-{llvm_system_cpu()}.json")
    code = ("import sys; from tvmnorm.cli import main; "
            f"main(['list', '--records', '--target', 'llvm', '--schedules', {str(schedules)!r}]); "
            "print('imported tvm' if 'tvm' in sys.modules else 'no tvm')")

    def listing(cache):
        env = {**os.environ, "TVMNORM_CACHE": str(cache)}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
        header, *_, last = out.splitlines()
        assert re.search(rf"/schedules/llvm-{re.escape(llvm_system_cpu())}\.json: \d+ records$", header), header
        return last
    cache = tmp_path / "cache"
    assert listing(cache) == "imported tvm"
    (kept,) = (cache / "host-cpu").iterdir()
    assert kept.read_text().strip() == llvm_system_cpu()
    assert listing(cache) == "no tvm"
    kept.write_text("not a cpu name\n")
    assert listing(cache) == "imported tvm" and kept.read_text().strip() == llvm_system_cpu()
    unwritable = tmp_path / "file"
    unwritable.write_text("")
    assert listing(unwritable) == "imported tvm"  # TVMNORM_CACHE a file: nothing kept, nothing lost


def test_warm_cache_fills_the_jit_cache_the_runtime_reads(tmp_path, monkeypatch):
    """scripts/warm_cache.py builds default kernels into the cache layout the registry uses (x's
    layouts too), so a GPU lease loads them instead of compiling (llvm here; CUDA goes through
    nvcc the same way); a layout it does not know is refused by name."""
    import tvmnorm.runtime as runtime
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "warm_cache.py")
    r = subprocess.run([sys.executable, script, "--target", "llvm", "--out", str(tmp_path), "--hidden", "96",
                        "--norms", "rmsnorm", "--stages", "fwd,bwd", "--dtypes", "fp32", "--jobs", "1",
                        "--layouts", "compact,heads"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "4 built" in r.stderr
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path))
    monkeypatch.setattr(runtime, "compile_funcs", lambda *a, **k: pytest.fail("compiled instead of loading the cache"))
    reg = runtime.Registry()
    reg.set_library("llvm", None)
    for stage in ("fwd", "bwd"):
        key = NormKey(stage=stage, itype="fp32", wtype="fp32", otype="fp32", hidden_size=96)
        assert reg.get(key, "llvm").origin == "default"
        assert reg.get(key, "llvm", "heads").origin == "default:heads"
    r = subprocess.run([sys.executable, script, "--target", "llvm", "--out", str(tmp_path), "--hidden", "96",
                        "--layouts", "rows"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "--layouts: 'rows'; each one of compact, strided, heads" in r.stderr


def test_list_shows_the_backward_chunk_size(tmp_path):
    """A backward kernel's line names its T (rows per dgamma partial), which the runtime sizes
    the partials by: llvm's default at hidden 128 is 128 rows (T * H >= 16384)."""
    out = tmp_path / "lib"
    tvmnorm_cli("build", "--target", "llvm", "--hidden", "128", "--norms", "rmsnorm", "--stages", "bwd",
                "--dtypes", "fp32", "--no-tuned", "--out", str(out))
    (line,) = [ln for ln in tvmnorm_cli("list", "--library", str(out)).splitlines() if ln.strip() and ln[0] != "#"]
    assert line.endswith("[default, T=128]"), line


@pytest.mark.slow
def test_search_overhead_runs_the_search_without_a_gpu():
    """scripts/search_overhead.py times the CUDA search with a fake builder and runner: every
    trial is recorded, nothing is compiled or timed on a device."""
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "search_overhead.py")
    # a forward key: its search takes half the backward's, which the nvcc run below searches
    r = subprocess.run([sys.executable, script, "--norms", "rmsnorm", "--stages", "fwd", "--hidden", "1024",
                        "--trials", "3"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # seeds: the default schedule, the committed record and torch.compile's launch shapes
    assert re.search(r"^1 keys, 1 tasks, 3 candidates \(and [2-9] seeds: .*3 trials per task", r.stdout, re.M), \
        r.stdout[-500:]
    # with the candidates really compiled by nvcc, while the search goes on (--overlap-builds)
    if not has_nvcc():
        pytest.skip("nvcc not installed")
    r = subprocess.run([sys.executable, script, "--norms", "rmsnorm", "--stages", "bwd", "--hidden", "1024",
                        "--chunk-rows", "16", "--trials", "3", "--build", "nvcc", "--overlap-builds"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "1 keys, 1 tasks, 3 candidates (and 1 seeds: " in r.stdout and "; 0 failed to build" in r.stdout, \
        r.stdout[-500:] + r.stderr[-2000:]


def test_search_quality_lines_up_the_tasks_of_two_runs():
    """scripts/search_quality.py names each task of a committed database from its arguments
    (norm, stage, hidden, the dx's T) and lines the same task up across runs: rmsnorm dx 5120 of
    the twenty-ninth lease (eta 0.2) beside the thirtieth's (eta 0.05)."""
    runs = os.path.join(os.path.dirname(__file__), "..", "tuning_logs", "cuda-sm_90")
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "search_quality.py")
    r = subprocess.run([sys.executable, script, os.path.join(runs, "run-2026-12-02-l29-rms"),
                        os.path.join(runs, "run-2026-12-02-l30-bwd")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    names = [ln for ln in r.stdout.splitlines() if not ln.startswith(" ")]
    assert names == sorted(f"{norm} dx h{h} T{t}" for norm, hs in (("rmsnorm", (3584, 4096, 5120, 8192)),
                                                                    ("layernorm", (3584, 4096)))
                           for h in hs for t in (32, 64)), names
    block = r.stdout.split("rmsnorm dx h5120 T32\n")[1].split("\n")[:2]
    assert "l29-rms" in block[0] and "l30-bwd" in block[1] and all("n= 4" in ln for ln in block), block


def test_build_and_tune_never_replace_a_folder_that_is_not_a_library(tmp_path, capsys):
    """A build replaces its --out folder whole (the new library is moved in at once): `--out .`
    or `--out schedules` deleted what the folder held. A folder holding anything but a library's
    files stops build, and tune before it searches; a library's folder is rebuilt in place, and
    a folder beside it named like the old one's temporary copy is left alone."""
    from tvmnorm.cli import main
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    common = ["--target", "llvm", "--hidden", "64", "--norms", "rmsnorm", "--stages", "fwd", "--dtypes", "fp32"]
    for args in (["build", *common, "--out", str(user)],
                 ["tune", *common, "--trials", "1", "--logs", str(tmp_path / "logs"), "--schedules",
                  str(tmp_path / "sch"), "--out", str(user)]):
        with pytest.raises(SystemExit) as stop:
            main(args)
        assert f"--out: {user} holds files that are not a tvmnorm library's (notes.txt)" in str(stop.value.code)
    assert [p.name for p in user.iterdir()] == ["notes.txt"] and (user / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "logs").exists() and not (tmp_path / "sch").exists()
    lib = tmp_path / "lib"
    (tmp_path / "lib.old").mkdir()
    (tmp_path / "lib.old" / "notes.txt").write_text("keep me too")
    for _ in range(2):
        main(["build", *common, "--no-tuned", "--layouts", "compact", "--out", str(lib)])
    assert sorted(p.name for p in lib.iterdir()) == [LIBRARY, MANIFEST]
    assert (tmp_path / "lib.old" / "notes.txt").read_text() == "keep me too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lib", "lib.old", "mine"]


@pytest.mark.parametrize("args,message", [
    (["tune", "--hidden", "0"], "--hidden sizes must be in [1, 1048576], got '0'"),
    (["tune", "--hidden", "64,2000000"], "--hidden sizes must be in [1, 1048576], got '64,2000000'"),
    (["build", "--hidden", "64,x"], "--hidden must be integers, got '64,x'"),
    (["tune", "--shapes", "nope"], "unknown shape group(s) ['nope']"),
    (["build", "--keys", "0xffffffffffffffff"], "--keys: packed key 0xffffffffffffffff sets reserved bits"),
    (["build", "--keys", "0xzz"], "--keys: '0xzz' is not a packed key (a decimal or 0x-hex integer)"),
    (["tune", "--hidden", "64", "--trials", "0"], "argument --trials: must be at least 1, got 0"),
    (["tune", "--hidden", "64", "--rows", "-1"], "argument --rows: must be at least 1, got -1"),
    (["tune", "--hidden", "64", "--batch", "0"], "argument --batch: must be at least 1, got 0"),
    (["build", "--hidden", "64", "--schedules", "/nonexistent/schedules"],
     "--schedules /nonexistent/schedules: no such directory"),
    (["bench", "--target", "llvm", "--hidden", "0"], "--hidden sizes must be in [1, 1048576], got '0'"),
    (["bench", "--target", "llvm", "--hidden", "64", "--rows", "8,-5"],
     "--rows takes train, decode or token counts of at least 1, got '-5'"),
    (["bench", "--target", "llvm", "--hidden", "64", "--max-sets", "0"], "argument --max-sets: must be at least 1, got 0"),
    (["build", "--hidden", "64", "--dtypes", "fp8e4m3"],
     "--dtypes fp8e4m3: fp8 is only an output type; select fp8-output keys with --fp8 fp8e4m3|fp8e5m2"),
    (["tune", "--hidden", "64", "--fp8", "bf16"], "argument --fp8: invalid choice: 'bf16'"),
    (["tune", "--hidden", "64", "--fp8-only"], "--fp8-only selects the keys of --fp8: name its otype"),
    (["build", "--hidden", "64", "--fp8", "fp8e4m3", "--fp8-only", "--stages", "bwd,bwd_add"],
     "--fp8-only: fp8 output exists at the forward stages ('fwd', 'fwd_add') alone, not at bwd,bwd_add"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_arguments_stop_before_any_work_naming_the_argument(tmp_path, capsys, args, message):
    """Before these stopped here, --trials 0 tuned nothing, said no candidate could be built, and
    still wrote the seeded default schedules as records (which --trials -3 then took for tuned);
    --rows 0 and -5 benchmarked empty cases; --hidden 0 and --shapes nope ended in a traceback; a
    misspelt --schedules built the default schedules without a word."""
    from tvmnorm.cli import main
    with pytest.raises(SystemExit) as stop:
        main([*args, "--logs", str(tmp_path / "logs"), "--schedules", str(tmp_path / "sch")] if args[0] == "tune"
             else args)
    assert stop.value.code != 0
    assert message in str(stop.value.code) + capsys.readouterr().err
    assert not (tmp_path / "sch").exists() and not (tmp_path / "logs").exists()


@pytest.mark.parametrize("cmd,flag", [("tune", "--logs"), ("tune", "--schedules"), ("build", "--out"),
                                      ("bench", "--out")])
def test_a_folder_that_cannot_be_written_stops_before_any_work(tmp_path, monkeypatch, cmd, flag):
    """A results folder under a file (or on a file system that refuses, /proc) stops the command
    at once, naming the argument: bench --out failed with a traceback after timing every case,
    tune and build with one from mkdir."""
    import tvmnorm.bench
    import tvmnorm.build
    import tvmnorm.tune
    from tvmnorm.cli import main

    def no_work(*_, **__):
        raise AssertionError("the work began")
    for module, name in ((tvmnorm.bench, "run"), (tvmnorm.tune, "tune_main"), (tvmnorm.build, "build_library")):
        monkeypatch.setattr(module, name, no_work)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    paths = {"--logs": tmp_path / "logs", "--schedules": tmp_path / "sch", "--out": tmp_path / "lib"}
    paths[flag] = blocker / "sub"
    args = {"tune": ["--hidden", "64", "--logs", str(paths["--logs"]), "--schedules", str(paths["--schedules"]),
                     "--out", str(paths["--out"])],
            "build": ["--hidden", "64", "--out", str(paths["--out"])],
            "bench": ["--hidden", "64", "--rows", "8", "--out", str(paths["--out"])]}[cmd]
    with pytest.raises(SystemExit) as stop:
        main([cmd, "--target", "llvm", *args])
    assert str(stop.value.code) == f"{flag}: {blocker} is a file, not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_schedules_file_that_does_not_parse_stops_tune_and_build_and_stays(tmp_path):
    """tune writes the records it chose over the target's schedules file: one that does not parse
    (a merge conflict, a truncated copy) stops it before any work, and stays as it was."""
    from tvmnorm.cli import main
    from tvmnorm.tune import schedules_path
    path = schedules_path("llvm", tmp_path)
    path.write_text('{"records": {"0x400000": ')
    for cmd in (["tune", "--logs", str(tmp_path / "logs")], ["build", "--out", str(tmp_path / "lib")]):
        with pytest.raises(SystemExit, match=f"{path} is not a schedules file .JSONDecodeError"):
            main([*cmd, "--target", "llvm", "--hidden", "64", "--dtypes", "fp32", "--schedules", str(tmp_path)])
    assert path.read_text() == '{"records": {"0x400000": '
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_build_refuses_fewer_than_one_job(tmp_path):
    res = subprocess.run([sys.executable, "-m", "tvmnorm", *BUILD, "--out", str(tmp_path / "lib"), "--jobs", "0"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode != 0 and "--jobs must be at least 1, got 0" in res.stderr
    assert not (tmp_path / "lib").exists()


def test_key_options_default_and_tell_a_selection_given():
    """add_key_args' --norms, --stages (the command's default) and --dtypes fill in when not
    given, and names_keys tells any option given, a default's value named included, from none."""
    import argparse
    from tvmnorm.cli import add_key_args, keys_from_args, names_keys
    p = argparse.ArgumentParser()
    add_key_args(p, stages_default="fwd,bwd_add")
    given = p.parse_args(["--hidden", "512"])
    assert keys_from_args(given) == [NormKey(norm=n, stage=s, hidden_size=512)
                                     for n in ("rmsnorm", "layernorm") for s in ("fwd", "bwd_add")]
    assert names_keys(given) and names_keys(p.parse_args(["--dtypes", "bf16"]))
    assert not names_keys(p.parse_args([]))
    assert {k.stage for k in keys_from_args(p.parse_args([]))} == {"fwd", "bwd_add"}


def test_fp8_only_selects_the_fp8_output_keys_alone():
    """--fp8 adds the fp8-output keys of the forward stages to the --dtypes keys; --fp8-only keeps
    them alone, so that a tune of the fp8 keys does not also retune their bf16 twins (a lease
    once spent half its tune on those)."""
    import argparse
    from tvmnorm.cli import add_key_args, keys_from_args
    p = argparse.ArgumentParser()
    add_key_args(p)
    sel = ["--hidden", "512", "--norms", "rmsnorm", "--stages", "fwd,bwd,fwd_add", "--fp8", "fp8e5m2"]
    fp8 = [NormKey(norm="rmsnorm", stage=s, otype="fp8e5m2", hidden_size=512) for s in ("fwd", "fwd_add")]
    both = keys_from_args(p.parse_args(sel))
    assert set(fp8) < set(both) and {k.stage for k in both if not k.fp8_out} == {"fwd", "bwd", "fwd_add"}
    assert keys_from_args(p.parse_args([*sel, "--fp8-only"])) == fp8


def test_build_tuned_only_takes_the_named_keys_that_have_records(tmp_path):
    """--tuned-only builds the keys named (--hidden, --stages, --keys, ...) that have a record, and
    all the records only where no key is named; a selection with no record stops, naming the
    file. It once took every record whatever was named: the leases' A/B builds of a few keys
    compiled the whole table (158 CUDA keys)."""
    from tvmnorm.tune import read_records, save_records, schedules_path
    fwd, bwd = (NormKey(norm="rmsnorm", stage=s, itype="fp32", wtype="fp32", otype="fp32", hidden_size=512)
                for s in ("fwd", "bwd"))
    committed = read_records(next((pathlib.Path(__file__).parent.parent / "schedules").glob("llvm-*.json")))
    records = {k: v for k, v in committed.items() if k in (fwd.pack(), bwd.pack())}
    assert set(records) == {fwd.pack(), bwd.pack()}
    save_records("llvm", records, tmp_path / "sch")
    common = ["build", "--target", "llvm", "--tuned-only", "--schedules", str(tmp_path / "sch"), "--layouts", "compact"]

    def built(out, *extra):
        tvmnorm_cli(*common, "--out", str(tmp_path / out), *extra)
        return [e["key"] for e in json.loads((tmp_path / out / MANIFEST).read_text())["kernels"]]
    assert built("named", "--hidden", "512,768", "--norms", "rmsnorm", "--stages", "fwd", "--dtypes", "fp32") \
        == [fwd.pack()]
    assert built("packed", "--keys", f"{bwd.pack():#x}") == [bwd.pack()]
    assert sorted(built("all")) == sorted(records)
    res = subprocess.run([sys.executable, "-m", "tvmnorm", *common, "--hidden", "768", "--dtypes", "fp32",
                          "--out", str(tmp_path / "none")], capture_output=True, text=True, timeout=600)
    assert res.returncode != 0 and "--tuned-only: none of the keys named has a tuned record in " in res.stderr, res.stderr
    assert str(schedules_path("llvm", tmp_path / "sch")) in res.stderr and not (tmp_path / "none").exists()


def test_build_takes_jobs(tmp_path):
    origin, _ = build_and_list(tmp_path / "lib", "--no-tuned", "--jobs", "2")
    assert origin == "default"


def test_device_carry_moves_results_out_of_the_tree_and_back(tmp_path):
    """scripts/device_carry.sh trim moves the raw tuning logs and the bench results but
    h200-tuned.json out of the carried tree, untracked files among them, and restore puts every
    one back; a second trim before a restore is refused."""
    import shutil
    root = tmp_path / "tree"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(os.path.dirname(__file__), "..", "scripts", "device_carry.sh"), root / "scripts")
    files = {"tuning_logs/cuda-sm_90/run-a/db.json.gz": "db", "tuning_logs/cuda-sm_90/README.md": "kept",
             "tuning_logs/llvm-znver5/x.json": "cpu", "bench/results/h200-tuned.json": "kept",
             "bench/results/h200-run14/new-uncommitted.json": "new", "bench/results/cpu.json": "cpu",
             "schedules/cuda-sm_90.json": "kept"}
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)

    def carry(what):
        return subprocess.run(["bash", str(root / "scripts" / "device_carry.sh"), what], capture_output=True,
                              text=True, timeout=60)
    assert carry("trim").returncode == 0
    present = {p for p in files if (root / p).exists()}
    assert present == {"tuning_logs/cuda-sm_90/README.md", "bench/results/h200-tuned.json", "schedules/cuda-sm_90.json"}
    again = carry("trim")
    assert again.returncode == 1 and "restore" in again.stderr
    assert carry("restore").returncode == 0
    assert {p: (root / p).read_text() for p in files} == files
    assert not (root / ".device" / "stash").exists()
    assert "nothing to restore" in carry("restore").stdout


@pytest.mark.parametrize("target,pdl,shown", [("cuda", True, " pdl=on"), ("cuda", False, " pdl=off"),
                                              ("cuda", None, ""), ("llvm", False, "")])
def test_list_says_whether_a_cuda_library_launches_with_pdl(tmp_path, target, pdl, shown):
    """The listing's header ends with the manifest's programmatic dependent launch flag for a CUDA
    library (build.build_library writes it; TVMNORM_PDL=0 builds turn it off), and says nothing
    where the manifest has no flag (a library built before it) or for llvm."""
    manifest = {"target": target, "arch": "sm_90" if target == "cuda" else "znver5", "tvm_version": "t",
                "ffi_version": "f", "tvmnorm_source_hash": "h", "sha256": "0" * 64, "kernels": []}
    if pdl is not None:
        manifest["pdl"] = pdl
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    header = tvmnorm_cli("list", "--target", target, "--library", str(tmp_path)).splitlines()[0]
    assert header.endswith("sha256=000000000000" + shown), header


@pytest.mark.parametrize("cmd", ["build", "tune"])
@pytest.mark.parametrize("arch,extra,said", [
    ("sm_86", ["--fp8", "fp8e4m3"], "TVMNORM_CUDA_ARCH is sm_86: fp8 output needs sm_89 or newer"),
    ("sm_75", [], "TVMNORM_CUDA_ARCH is sm_75: tvmnorm's CUDA kernels need sm_80 or newer")])
def test_cuda_build_and_tune_stop_where_the_arch_cannot_run_the_keys(tmp_path, cmd, arch, extra, said):
    """Before any compile (nvcc's errors about undeclared fp8 types would say it far less
    clearly) and without touching the output or the records."""
    res = subprocess.run([sys.executable, "-m", "tvmnorm", cmd, "--target", "cuda", "--hidden", "1024", "--stages",
                          "fwd", *extra, *(["--out", str(tmp_path / "lib")] if cmd == "build" else
                                           ["--logs", str(tmp_path / "logs"), "--schedules", str(tmp_path / "s")])],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, TVMNORM_CUDA_ARCH=arch))
    assert res.returncode != 0 and said in res.stderr, res.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_cuda_build_for_another_gpu(tmp_path):
    """`tvmnorm build --target cuda --arch sm_80` on any machine: a library whose manifest says
    sm_80, compiled by nvcc for it (an A100's library built on a box without one); an arch the
    kernels cannot run on stops with its name, and --arch with llvm is refused."""
    if not has_nvcc():
        pytest.skip("nvcc not installed")
    out = tmp_path / "lib"
    tvmnorm_cli("build", "--target", "cuda", "--arch", "sm_80", "--hidden", "1024", "--norms", "rmsnorm",
                "--stages", "fwd", "--layouts", "compact", "--out", str(out))
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["arch"] == "sm_80" and manifest["target_spec"]["arch"] == "sm_80" and not manifest["pdl"]
    assert b"sm_80" in (out / LIBRARY).read_bytes()
    for args, said in ((["--target", "cuda", "--arch", "sm_70"], "--arch is sm_70: tvmnorm's CUDA kernels need sm_80"),
                       (["--target", "llvm", "--arch", "sm_80"], "--arch is a CUDA GPU's")):
        res = subprocess.run([sys.executable, "-m", "tvmnorm", "build", *args, "--hidden", "1024", "--stages", "fwd",
                              "--out", str(tmp_path / "no")], capture_output=True, text=True, timeout=600)
        assert res.returncode != 0 and said in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_fwd_add_keys_build_list_and_run_from_the_library(tmp_path, rng, seed):
    """`--stages fwd_add` (with --fp8, its fp8-output keys too) builds the residual add's
    forward into a library, `list` names the stage, and the library's kernels (compact and
    strided x) are right against float64, h torch's add bit for bit."""
    from conftest import call, check_outputs, make_inputs, x_in_layout
    from tvmnorm.runtime import Registry
    out = tmp_path / "lib"
    tvmnorm_cli("build", "--target", "llvm", "--hidden", "1000", "--norms", "rmsnorm,layernorm", "--stages", "fwd_add",
                "--dtypes", "bf16", "--fp8", "fp8e4m3", "--no-tuned", "--layouts", "compact,strided", "--out", str(out))
    listing = [ln for ln in tvmnorm_cli("list", "--library", str(out)).splitlines() if not ln.startswith("#")]
    assert len(listing) == 4 and all(" fwd_add " in ln for ln in listing), listing
    registry = Registry()
    registry.set_library("llvm", out)
    for norm in ("rmsnorm", "layernorm"):
        for otype in ("bf16", "fp8e4m3"):
            key = NormKey(norm=norm, stage="fwd_add", otype=otype, hidden_size=1000)
            for layout in ("compact", "strided"):
                kernel = registry.get(key, "llvm", layout)
                assert kernel.origin == f"library:default{'' if layout == 'compact' else ':' + layout}", kernel.origin
                inputs = make_inputs(key, 37, rng)
                given = inputs if layout == "compact" else dict(inputs, x=x_in_layout(inputs["x"], layout))
                outs = call(kernel, given, 37)
                check_outputs(key, inputs, outs, f"{key.name} {layout} seed={seed}")


def test_the_slow_tests_run_first():
    """conftest's collection hook puts the tests marked slow ahead of the rest, each group in its
    order, so that the README's test command does not end on one xdist worker running them after
    the other ran out."""
    import conftest

    class Item:
        def __init__(self, name, slow):
            self.name, self.slow = name, slow

        def get_closest_marker(self, name):
            return object() if name == "slow" and self.slow else None
    items = [Item("a", False), Item("b", True), Item("c", False), Item("d", True)]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.name for i in items] == ["b", "d", "a", "c"]


def test_the_wheel_carries_the_committed_records(tmp_path):
    """A wheel (`pip install .`, not -e) installs the package without the repository: the records
    a build takes travel inside it (tvmnorm/_schedules, a link to schedules/), byte for byte.
    Before, such an install built default kernels for every key, without a word."""
    repo = pathlib.Path(__file__).parent.parent
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(repo / "pyproject.toml", src)
    shutil.copytree(repo / "schedules", src / "schedules")
    shutil.copytree(repo / "tvmnorm", src / "tvmnorm", symlinks=True,
                    ignore=shutil.ignore_patterns("_lib", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "wheel"), str(src)], check=True, capture_output=True, timeout=600)
    import zipfile
    (wheel,) = (tmp_path / "wheel").glob("tvmnorm-*.whl")
    with zipfile.ZipFile(wheel) as z:
        carried = {pathlib.PurePosixPath(n).name: z.read(n) for n in z.namelist() if n.startswith("tvmnorm/_schedules/")}
    committed = {p.name: p.read_bytes() for p in (repo / "schedules").glob("*.json")}
    assert committed and carried == committed


def test_an_install_without_the_repository_reads_the_packaged_records_and_tune_asks_for_folders(
        tmp_path, monkeypatch):
    """Where schedules/ is not beside the package (a wheel's install), build and `list
    --records` read the copy in the package, and tune, which would write into the installed
    package, stops until --logs and --schedules are named."""
    import tvmnorm.tune
    from tvmnorm.cli import _records_for, main
    from tvmnorm.tune import PACKAGED_SCHEDULES, committed_schedules, read_records, schedules_path
    assert committed_schedules() == tvmnorm.tune.CHECKOUT_SCHEDULES
    checkout = read_records(schedules_path("cuda"))
    monkeypatch.setattr(tvmnorm.tune, "CHECKOUT_SCHEDULES", tmp_path / "no-repository" / "schedules")
    assert committed_schedules() == PACKAGED_SCHEDULES
    assert checkout and _records_for("cuda") == checkout
    ran = []
    monkeypatch.setattr(tvmnorm.tune, "tune_main", lambda args, keys, out: ran.append((args.logs, args.schedules)))
    common = ["tune", "--target", "llvm", "--hidden", "64", "--no-build"]
    with pytest.raises(SystemExit, match="tune: name --logs DIR: this tvmnorm is installed without its repository"):
        main([*common, "--schedules", str(tmp_path / "sch")])
    with pytest.raises(SystemExit, match="tune: name --schedules DIR"):
        main([*common, "--logs", str(tmp_path / "logs")])
    assert not ran
    main([*common, "--logs", str(tmp_path / "logs"), "--schedules", str(tmp_path / "sch")])
    assert ran == [(str(tmp_path / "logs"), str(tmp_path / "sch"))]

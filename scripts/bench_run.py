"""Parts of scripts/bench: mimalloc-bench's programs, built from their public
sources, and the table of `mtrace run` (the program under the preload alone,
the whole command, and the time from the program's exit to mtrace's).

mimalloc-bench (https://github.com/daanx/mimalloc-bench) is an outside
allocation benchmark; its programs are built here from a checkout (`--mimalloc-
bench DIR`, else a shallow clone into the bench's temporary folder) with the
flags of its bench/CMakeLists.txt, and run with the arguments its bench.sh
gives them, with 2 threads where it takes a count.
"""
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO = "https://github.com/daanx/mimalloc-bench"

# Its CMakeLists.txt silences these: the sources are old C.
QUIET = ["-w", "-Wno-implicit-function-declaration", "-Wno-implicit-int", "-Wno-int-conversion",
         "-Wno-return-mismatch", "-Wno-incompatible-pointer-types"]

CFRAC = ("cfrac.c pops.c pconst.c pio.c pabs.c pneg.c pcmp.c podd.c phalf.c padd.c psub.c pmul.c pdivmod.c "
         "psqrt.c ppowmod.c atop.c ptoa.c itop.c utop.c ptou.c errorp.c pfloat.c pidiv.c pimod.c picmp.c "
         "primes.c pcfrac.c pgcd.c").split()


def checkout(given, tmp):
    """The mimalloc-bench sources: `given`, or a shallow clone into `tmp`
    (None, with a note, when there is neither)."""
    if given:
        return given
    dest = os.path.join(tmp, "mimalloc-bench")
    r = subprocess.run(["git", "clone", "-q", "--depth", "1", REPO, dest], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        print(f"note: no mimalloc-bench rows: git clone {REPO} failed ({r.stderr.strip()}); "
              "--mimalloc-bench DIR takes a checkout", file=sys.stderr)
        return None
    return dest


def mimalloc_programs(src, tmp, scale):
    """Builds mimalloc-bench's cfrac, espresso, glibc-simple, glibc-thread,
    larson, xmalloc-test, rptest and mstress from checkout `src` into `tmp`:
    (name, command) rows, as its bench.sh runs them (2 threads). -O2 -g
    (frames for the reports), as the bench's other C programs."""
    b = os.path.join(src, "bench")
    out = lambda n: os.path.join(tmp, n)
    cc = ["gcc", "-O2", "-g"] + QUIET
    builds = [
        ("cfrac", cc + ["-std=gnu89", "-DNOMEMOPT=1"] + [os.path.join(b, "cfrac", f) for f in CFRAC] + ["-lm"]),
        ("espresso", cc + ["-std=gnu89"] + sorted(os.path.join(b, "espresso", f)
                                                  for f in os.listdir(os.path.join(b, "espresso"))
                                                  if f.endswith(".c")) + ["-lm"]),
        ("glibc-simple", cc + [os.path.join(b, "glibc-bench", "bench-malloc-simple.c"), "-pthread"]),
        ("glibc-thread", cc + [os.path.join(b, "glibc-bench", "bench-malloc-thread.c"), "-pthread"]),
        ("larson", ["g++", "-O2", "-g", "-w", "-DCPP=1", os.path.join(b, "larson", "larson.cpp"), "-pthread"]),
        ("xmalloc-test", cc + [os.path.join(b, "xmalloc-test", "xmalloc-test.c"), "-pthread"]),
        ("rptest", cc + ["-I", os.path.join(b, "rptest")] + [os.path.join(b, "rptest", f)
                                                              for f in ("rptest.c", "thread.c", "timer.c")]
         + ["-pthread", "-lm"]),
        ("mstress", cc + [os.path.join(b, "mstress", "mstress.c"), "-pthread"]),
    ]
    for name, cmd in builds:
        subprocess.run(cmd + ["-o", out(name)], check=True)
    big = "17545186520507317056371138836327483792789528" if scale == 1 else "41757646344123832613190542166099121"
    return [
        ("cfrac", [out("cfrac"), big]),
        ("espresso", [out("espresso"), os.path.join(b, "espresso", "largest.espresso")]),
        ("glibc-simple", [out("glibc-simple")]),
        ("glibc-thread", [out("glibc-thread"), "2"]),
        ("larson", [out("larson"), "5", "8", "1000", "5000", "100", "4141", "2"]),
        ("xmalloc-test", [out("xmalloc-test"), "-w", "2", "-t", "5", "-s", "64"]),
        ("rptest", [out("rptest"), "2", "0", "1", "2", "500", "1000", "100", "8", "16000"]),
        ("mstress", [out("mstress"), "2", "50", "25"]),
    ]


def run_once(cmd, env, cwd):
    """Wall seconds of `cmd` (which must succeed) and when it ended
    (time.time())."""
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, time.time()


def bench_run(runs, tmp, lib, mtrace, work):
    """For each (name, cmd) of `work`, alternating, `runs` times: the program
    under the preload alone (its trace to a file), and `mtrace run` of it
    (the leak scan at exit, as by default; report to /dev/null). Medians of
    (preload wall s, run wall s, s from the program's exit to mtrace's): the
    program's exit is its trace's last write (the file's mtime; the newest
    trace where it started others)."""
    rows = []
    for name, cmd in work:
        pre, whole, after = [], [], []
        for i in range(runs):
            d = os.path.join(tmp, f"run-{name}")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            env = dict(os.environ, LD_PRELOAD=lib, MTRACE_OUTPUT=os.path.join(d, "alone.%p.mtrace"))
            pre.append(run_once(cmd, env, d)[0])
            shutil.rmtree(d)
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            w, end = run_once([mtrace, "run", "-o", os.devnull, "--trace-dir", d, "--"] + cmd, env, tmp)
            last = max(os.path.getmtime(os.path.join(d, f)) for f in os.listdir(d))
            whole.append(w)
            after.append(end - last)
        rows.append((name, statistics.median(pre), statistics.median(whole), statistics.median(after)))
    return rows


def run_table(rows):
    """The markdown table of [`bench_run`]'s rows."""
    lines = ["| mtrace run (leak scan at exit) | the preload alone | mtrace run | from the program's exit to the "
             "report's end |", "|---|---|---|---|"]
    for name, pre, whole, after in rows:
        lines.append(f"| {name} | {pre:.2f} s | {whole:.2f} s ({whole / pre:.2f}x) | {after:.3f} s |")
    return "\n".join(lines)


if __name__ == "__main__":
    # The run table alone, of one build (`--root`: a checkout with its
    # target/release built), on mimalloc-bench's programs but mstress:
    # for an old build against a new one, run in turn.
    import argparse
    import tempfile
    ap = argparse.ArgumentParser(description="mtrace run's table of one build on mimalloc-bench's programs")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--mimalloc-bench", metavar="DIR", default=os.environ.get("MIMALLOC_BENCH"))
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    release = os.path.join(a.root, "target", "release")
    with tempfile.TemporaryDirectory(prefix="mtrace-bench-run.") as tmp:
        src = checkout(a.mimalloc_bench, tmp)
        if src:
            work = [w for w in mimalloc_programs(src, tmp, 1) if w[0] != "mstress"]
            rows = bench_run(a.runs, tmp, os.path.join(release, "libmtrace.so"), os.path.join(release, "mtrace"), work)
            print(run_table(rows))

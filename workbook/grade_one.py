"""One grading process: one chapter's exercises.py of one submission, in its sandbox (grade_sandbox.py).

    python -I ROOT/workbook/grade_one.py --chapter ch01 --exercises ch01.1,ch01.2 --result-fd 3 \\
        --home HOME --read DIR ...
    python -I ROOT/workbook/grade_one.py --compile-worker --home HOME --read DIR ...

ROOT is the unit's copy of the handout, with the student's exercises.py in its chapter; HOME is its
cwd, HOME and TMPDIR. The second form is the GPU compiler's worker (workbook/compiler.py), which the
first starts itself when a launch needs it. In this order:

1. the copy first on sys.path, and the editable install's finder dropped: it maps `chapters` to the
   instructor's checkout, where solutions.py is;
2. the workbook and the chapter's checks imported: the grader's code only;
3. what reports bound: `evaluate`, the result file (a descriptor the parent opened), json;
4. the guard (grade_guard.py): the audit hook, then the tripwire;
5. the student's module imported, each exercise evaluated, each result written as one JSON line as
   soon as it is known (a process killed later keeps what it graded);
6. os._exit: no atexit handler or thread of the submission runs after the last line.

Each status is the grader's `evaluate`'s; what the student's code cannot reach is the parent, which
reads these lines and trusts nothing else (grade_sandbox.read_results).
"""

import os
import sys

MESSAGE_LIMIT = 20_000  # characters of one check's message kept
NOT_GRADED = "not graded"  # beside exercises.py's statuses: an exercise this process could not grade


def _only_this_copy(root):
    sys.path[:] = [root] + [p for p in sys.path if p and os.path.abspath(p) != root]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "").lower()]
    sys.dont_write_bytecode = True  # the copy's .pyc were compiled once, by the parent


def _arguments(argv):
    import argparse

    parser = argparse.ArgumentParser(prog="grade_one.py")
    parser.add_argument("--chapter")
    parser.add_argument("--exercises", default="")
    parser.add_argument("--result-fd", type=int)
    parser.add_argument("--home", required=True)
    parser.add_argument("--read", action="append", default=[], help="a folder of Python's installation")
    parser.add_argument("--compile-worker", action="store_true")
    parser.add_argument("--no-compiler", action="store_true", help="the GPU compiler is not installed")
    return parser.parse_args(argv)


def _worker_command(root, args):
    argv = [sys.executable, "-I", os.path.join(root, "workbook", "grade_one.py"), "--compile-worker",
            "--home", args.home] + [item for folder in args.read for item in ("--read", folder)]
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", WORKBOOK_DEVICE="compile")
    return tuple(argv), env


class _Spawned:
    """What compiler.Compiler keeps of its worker process (stdin, stdout, poll()), started with
    os.posix_spawn: the guard lets that one command line through and refuses subprocess."""

    def __init__(self, argv, env, close=(), merge_stderr=False):
        into_r, into_w = os.pipe()
        out_r, out_w = os.pipe()
        actions = [(os.POSIX_SPAWN_DUP2, into_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                   *([(os.POSIX_SPAWN_DUP2, out_w, 2)] if merge_stderr else []),
                   *((os.POSIX_SPAWN_CLOSE, fd) for fd in close)]  # the result file stays the grader's
        self.pid = os.posix_spawn(argv[0], list(argv), env, file_actions=actions)
        os.close(into_r)
        os.close(out_w)
        self.stdin, self.stdout, self.returncode = os.fdopen(into_w, "wb"), os.fdopen(out_r, "rb"), None

    def poll(self):
        if self.returncode is None and os.waitpid(self.pid, os.WNOHANG)[0]:
            self.returncode = -1
        return self.returncode


class _Ran:
    """subprocess.run's answer, as compiler._ptx_facts reads it (stdout and stderr in one pipe)."""

    def __init__(self, argv, **_options):
        spawned = _Spawned(argv, dict(os.environ), merge_stderr=True)
        spawned.stdin.close()
        self.stdout, self.stderr = "", spawned.stdout.read().decode(errors="replace")
        self.returncode = os.waitstatus_to_exitcode(os.waitpid(spawned.pid, 0)[1])


def _first_compile(compiler):
    """A tiny kernel through the worker's own path (numba's typing, NVVM for each target, ptxas)."""
    import cloudpickle
    from numba import float32

    def tiny(x):
        x[0] = 1.0

    compiler._compile_one(cloudpickle.dumps(tiny), (float32[::1],), compiler.CCS)


def serve_compiles(root, args):
    """The compile worker: compiler.serve(), guarded; ptxas started through os.posix_spawn."""
    import types

    import workbook  # noqa: F401  (compile mode: numba's CUDA target, no GPU)
    from workbook import compiler, grade_guard

    ptxas = compiler._ptxas()
    _first_compile(compiler)  # NVVM is loaded through ctypes' dlopen, which the guard then refuses
    compiler.subprocess = types.SimpleNamespace(run=_Ran)  # the worker's only process: ptxas -v, on a file
    grade_guard.install(read=[root, *args.read], write=[args.home],
                        spawn=[(ptxas, grade_guard.FILES_IN_WRITE)] if ptxas else [])
    compiler.serve()
    os._exit(0)


def _compile_in_a_worker(compiler, root, args):
    """The GPU compiler's worker started by this process's command line (the guard's one allowed spawn),
    or no compiling at all where the parent found no compiler. The spawn the guard is to allow."""
    if args.no_compiler:
        os.environ["WORKBOOK_COMPILE"] = "0"
        return []
    compiler._missing[:] = [None]  # the parent asked once: no probe process here
    argv, env = _worker_command(root, args)

    def worker(self):  # compiler.Compiler._worker's job
        if self.process is None or self.process.poll() is not None:
            self.process = _Spawned(argv, env, close=(args.result_fd,))
        return self.process

    compiler.Compiler._worker = worker
    return [(argv[0], argv)]


def grade(root, args):
    import json

    import workbook  # noqa: F401  (the mode, from WORKBOOK_DEVICE, before numba.cuda)
    from workbook import compiler, exercises, grade_guard

    results = os.fdopen(args.result_fd, "w", buffering=1, encoding="utf-8")
    evaluate, describe, dumps, end = exercises.evaluate, exercises._message, json.dumps, os._exit
    flushes = (sys.__stdout__.flush, sys.__stderr__.flush)

    def exit_now():  # what the submission printed reaches output.txt; nothing of it runs after this
        results.write(dumps({"done": True}) + "\n")
        results.flush()
        for flush in flushes:
            try:
                flush()
            except Exception:  # noqa: BLE001, S110  (a full output file: the limit cut it off)
                pass
        end(0)

    def report(exercise_id, status, message="", ratio=None):
        message = (message or "").replace(root + os.sep, "").replace(args.home, "~")
        results.write(dumps({"exercise": exercise_id, "status": status, "message": message[:MESSAGE_LIMIT],
                             "ratio": None if ratio is None else float(ratio)}) + "\n")

    wanted = args.exercises.split(",")
    found = {e.id: e for e in exercises.all_exercises((args.chapter,))}
    grade_guard.install(read=[root, args.home, *args.read], write=[args.home, os.path.join(root, "build")],
                        spawn=_compile_in_a_worker(compiler, root, args))
    name = f"chapters.{exercises.chapters()[args.chapter].name}.exercises"
    tripwire = grade_guard.Tripwire(skip={name}, objects=list(found.values()))

    try:
        module = exercises.load(args.chapter)  # the student's code runs from here on
    except BaseException as error:  # noqa: BLE001  (SystemExit at import is the student's too)
        for exercise_id in wanted:
            report(exercise_id, exercises.WRONG, f"your exercises.py does not import: {_first_line(error)}\n"
                   + describe(error))
        exit_now()
    moved = tripwire.changed()
    for exercise_id in wanted:
        if exercise_id not in found:
            report(exercise_id, NOT_GRADED, f"the workbook being graded has no exercise {exercise_id}")
            continue
        if not moved:
            try:
                result = evaluate(found[exercise_id], module)
                status, message, ratio = result.status, result.message, result.ratio
            except BaseException as error:  # noqa: BLE001  (SystemExit, KeyboardInterrupt from a check's call)
                status, ratio = exercises.WRONG, None
                message = f"your code stopped the check: {_first_line(error)}\n" + describe(error)
            moved = tripwire.changed()
        if moved:
            status, ratio = exercises.WRONG, None
            message = ("your code replaced part of the grader, which a submission may not do: "
                       + ", ".join(moved[:5]) + (" ..." if len(moved) > 5 else ""))
        report(exercise_id, status, message, ratio)
    exit_now()


def _first_line(error):
    return f"{type(error).__name__}: {error}".split("\n", 1)[0][:300]


def main(argv=None):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _only_this_copy(root)
    args = _arguments(sys.argv[1:] if argv is None else argv)
    if args.compile_worker:
        serve_compiles(root, args)
    else:
        grade(root, args)


if __name__ == "__main__":
    main()

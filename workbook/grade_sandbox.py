"""Where a grading process runs: its own copy of the handout, limits, a timeout, and where Linux lets
an unprivileged user make namespaces, a file system that hides the rest of the machine.

    RUN/                   a temporary folder of the parent's
      handout/             the committed workbook without solutions.py (handout.write), the grader's
                           child modules added, compiled to .pyc once; no child sees it
      u0007/root/          a copy of handout/ (what a child imports: not results/, tests/, docs/, tools/)
                           with one submission's exercises.py in its chapter
      u0007/home/          the child's cwd, HOME and TMPDIR: with root/build/, all it may write
      u0007/result.jsonl   opened by the parent, handed to the child as a descriptor (grade_one.py)
      u0007/output.txt     the child's stdout and stderr, cut off at LIMITS["file_bytes"]

A copy rather than links: links share one file between every unit, and a unit that got round its
guard could change the workbook its neighbours are graded with; a copy takes a tenth of a second or
so, next to a grading process's seconds. Each unit is one chapter's file of one submission, so that
one file's code cannot change how another is graded (a cached grade is a function of the file).

Namespaces (`isolation="namespaces"`, used where `unshare --user --map-root-user --mount --pid --net`
works): the child sees the machine read-only, with the instructor's checkout, the submissions, the
grade cache, the temporary folder and HOME hidden behind empty folders, and only Python's
installation and its own unit put back; it has no network; its processes live in their own PID
namespace, so a timeout ends them all; and it runs in a second user namespace, in which the mounts
are locked: it cannot undo any of this.
"""

import functools
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .exercises import CORRECT, FAST, NOT_ATTEMPTED, SLOW, WRONG
from .grade_one import NOT_GRADED

STATUSES = (CORRECT, FAST, SLOW, WRONG, NOT_ATTEMPTED, NOT_GRADED)  # what a child may report
LIMITS = {"memory_bytes": 8 << 30, "file_bytes": 8 << 20, "open_files": 1024}
OUTPUT_KEPT = 4000  # characters of a child's stdout and stderr kept in the report (its start and end)
CHILD_MODULES = ("grade_one.py", "grade_guard.py")
NOT_COPIED = ("results", "tests", "docs", "tools")  # what no check reads: a unit's copy is the rest
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
RUNNING = set()  # the children running now (stop_all's)


@functools.cache
def python_folders():
    """Python's installation, which every child reads (its standard library, site-packages)."""
    import site

    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages()}
    return sorted({os.path.realpath(folder) for folder in found if os.path.isdir(folder)})


def build_handout(run_dir):
    """The handout in run_dir/handout, compiled, with this checkout's child modules; (path, problems)."""
    import compileall

    from . import handout

    target = Path(run_dir) / "handout"
    _, problems = handout.write(target, force=True)
    for name in CHILD_MODULES:  # the child must be this grader's, committed or not
        shutil.copy2(Path(__file__).with_name(name), target / "workbook" / name)
    for folder in ("workbook", "chapters"):
        compileall.compile_dir(target / folder, quiet=1, workers=1)
    return target, problems


def handout_version(handout_dir, extra=""):
    """What a cached grade depends on besides the student's file: every file a unit's copy holds but the
    chapters' exercises.py, and `extra` (the mode, Python's and numba's versions)."""
    import hashlib

    digest = hashlib.sha256(extra.encode())
    for path in sorted(Path(handout_dir).rglob("*")):
        relative = path.relative_to(handout_dir).as_posix()
        if path.is_file() and "__pycache__" not in relative and not relative.endswith("/exercises.py") \
                and relative.split("/")[0] not in NOT_COPIED:
            digest.update(relative.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def namespaces_work():
    """Can this user make the namespaces `isolation="namespaces"` uses (and mount in them)?"""
    if not (os.path.exists(UNSHARE) and shutil.which("bash")):
        return False
    with tempfile.TemporaryDirectory() as probe:
        done = subprocess.run([UNSHARE, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child",
                               "--mount-proc", "--net", "bash", "-c", f"mount -t tmpfs tmpfs {shlex.quote(probe)}"],
                              capture_output=True, timeout=30)
    return done.returncode == 0


def _namespace_command(command, hide, keep):
    """command, run with `hide` behind empty read-only folders, all else read-only, `keep` put back
    (the first of `keep` writable, the rest read-only), in a user namespace of its own."""
    quote = shlex.quote
    lines = ["set -e"]
    lines += [f"exec {100 + i}<{quote(path)}" for i, path in enumerate(keep)]  # reachable once hidden
    lines.append("while read -r _ _ _ _ point _; do mount -o remount,bind,ro \"$point\" 2>/dev/null || true; "
                 "done < /proc/self/mountinfo")
    lines += [f"mount -t tmpfs -o mode=755 tmpfs {quote(path)}" for path in hide]
    for i, path in enumerate(keep):
        lines.append(f"mkdir -p {quote(path)}")
        lines.append(f"mount --no-canonicalize --rbind /proc/self/fd/{100 + i} {quote(path)}")
        lines.append(f"mount -o remount,bind,{'rw' if i == 0 else 'ro'} {quote(path)}")
    lines += [f"exec {100 + i}<&-" for i in range(len(keep))]
    lines += [f"mount -o remount,bind,ro {quote(path)}" for path in hide]
    lines.append(f"exec {UNSHARE} --user --mount -- \"$@\"")
    return [UNSHARE, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
            "--net", "bash", "-c", "\n".join(lines), "bash", *command]


def _limits(cpu_seconds):
    """Applied in the child before it starts Python: CPU time, memory, file size, no core files."""

    def apply():
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_AS, (LIMITS["memory_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMITS["file_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMITS["open_files"],) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), it does not kill

    return apply


def prepare(unit_dir, handout_dir, chapter_folder, source):
    """The unit's folder: a copy of the handout with `source` as the chapter's exercises.py."""
    root, home = unit_dir / "root", unit_dir / "home"
    shutil.copytree(handout_dir, root, symlinks=True, ignore=lambda folder, names: [
        name for name in names if folder == str(handout_dir) and name in NOT_COPIED])
    chapter = root / "chapters" / chapter_folder
    (chapter / "exercises.py").write_bytes(source)
    for stale in (chapter / "__pycache__").glob("exercises.*.pyc"):  # the stub's
        stale.unlink()
    (root / "build").mkdir(exist_ok=True)
    (home / "tmp").mkdir(parents=True)
    return root, home


def run(unit_dir, root, home, chapter, exercise_ids, timeout, isolation, hide=(), compiler_ok=True):
    """Grade one unit in a child process; {exercise id: {status, message, ratio}} and what happened."""
    result_path, output_path = unit_dir / "result.jsonl", unit_dir / "output.txt"
    result_fd = os.open(result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    output_fd = os.open(output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # read back through descriptors opened now: by the end the paths may name something else (a link, a FIFO)
    results, output = open(result_path, "rb"), open(output_path, "rb")
    command = [sys.executable, "-I", str(root / "workbook" / "grade_one.py"), "--chapter", chapter,
               "--exercises", ",".join(exercise_ids), "--result-fd", str(result_fd), "--home", str(home),
               *[item for folder in python_folders() for item in ("--read", folder)]]
    if not compiler_ok:
        command.append("--no-compiler")
    if isolation == "namespaces":
        command = _namespace_command(command, hide=hide, keep=[str(unit_dir), *python_folders()])
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home / "tmp"), "LANG": "C.UTF-8",
           "PYTHONPATH": str(root), "PYTHONHASHSEED": "0",  # (-I ignores PYTHONPATH) one file, one grade
           **{k: v for k, v in os.environ.items() if k in ("WORKBOOK_DEVICE", "WORKBOOK_COMPILE")}}
    started = time.monotonic()
    child = subprocess.Popen(command, cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=output_fd,
                             stderr=output_fd, pass_fds=(result_fd,), start_new_session=True,
                             preexec_fn=_limits(int(timeout) + 10))
    os.close(result_fd)
    os.close(output_fd)
    RUNNING.add(child)
    try:
        child.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _end_group(child)
        RUNNING.discard(child)
    with results, output:
        graded, problems = read_results(results, exercise_ids)
        return {"results": graded, "problems": problems, "timed_out": timed_out, "returncode": child.returncode,
                "seconds": round(time.monotonic() - started, 1), "output": _output(output)}


def stop_all():
    """End every child still running (the grader was interrupted)."""
    for child in list(RUNNING):
        _end_group(child)


def _end_group(child):
    """Kill what is left of the child's session (its compile worker, anything it started), then reap it."""
    for kill in (lambda: os.killpg(child.pid, signal.SIGKILL), child.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
    child.wait()


def read_results(lines, exercise_ids):
    """The child's result lines (a file open for reading), trusted only as far as they parse: known
    exercises, known statuses, each once. A second line for an exercise means the submission wrote
    to the grader's file."""
    graded, problems, seen = {}, [], set()
    for number, raw in enumerate(lines.read(LIMITS["file_bytes"]).splitlines(keepends=True), 1):
        try:
            record = json.loads(raw)
        except Exception:  # noqa: BLE001  (ValueError, or RecursionError on a crafted line)
            if raw.endswith(b"\n"):
                problems.append(f"line {number} of the results is not JSON: the submission wrote to them?")
            continue
        if not isinstance(record, dict) or record.get("done"):
            continue
        ident, status = record.get("exercise"), record.get("status")
        if ident not in exercise_ids or status not in STATUSES or not isinstance(record.get("message"), str):
            problems.append(f"line {number} of the results is not the grader's")
            continue
        if ident in seen:
            problems.append(f"{ident} was reported twice: the submission wrote to the grader's results")
            graded[ident] = {"status": WRONG, "message": problems[-1], "ratio": None}
            continue
        seen.add(ident)
        ratio = record.get("ratio")
        graded[ident] = {"status": status, "message": record["message"],
                         "ratio": ratio if isinstance(ratio, int | float) else None}
    return graded, problems


def _output(output):
    """The start and the end of what the child printed (a file open for reading)."""
    size = os.fstat(output.fileno()).st_size
    head = output.read(OUTPUT_KEPT).decode(errors="replace")
    if size > 2 * OUTPUT_KEPT:
        output.seek(size - OUTPUT_KEPT)
        head += f"\n[... {size - 2 * OUTPUT_KEPT} bytes left out ...]\n"
        head += output.read(OUTPUT_KEPT).decode(errors="replace")
    elif size > OUTPUT_KEPT:
        head += output.read(OUTPUT_KEPT).decode(errors="replace")
    return head + (f"\n[output cut off at {LIMITS['file_bytes']} bytes]" if size >= LIMITS["file_bytes"] else "")

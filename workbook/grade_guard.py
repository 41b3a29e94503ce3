"""What a grading process puts in place before it imports a student's module (grade_one.py): an
audit hook that refuses what grading never needs, and a tripwire on the grader's own code.

The hook (PEP 578) sees what the interpreter is asked to do and refuses by raising PermissionError:

    refused                                          except
    opening or listing a path outside `read`         an open file descriptor
    writing, removing, renaming, linking, chmod ...  inside `write` (the unit's home and its compile cache)
      outside `write`
    starting a process: subprocess, os.system,       the command lines of `spawn`, through os.posix_spawn
      exec, fork, posix_spawn                        (the compile worker's; in that worker, ptxas on its files)
    sockets, ctypes' dlopen and dlsym, gc's walks over objects, sys.settrace and setprofile,
    resource.setrlimit, a signal to another process, importing _posixsubprocess (its fork_exec raises
    no event, so the module is taken away), replacing the code or defaults of this module's functions

Everything the hook decides with is bound in its defaults, so rebinding os.path.realpath or
builtins.any changes nothing. It is a seatbelt, not a sandbox (CPython's documentation says as
much): it stops a submission that opens ../solutions.py, removes a file or starts a shell, by mistake
or on purpose; but ctypes, which numba has loaded, can write any byte of the process without an
event, and code that does so can do whatever the process may. What bounds that is the process and
its file system (grade_sandbox.py).

The tripwire: every function (its code, defaults and closure too) and class that the grader's modules
(and numpy's, numba's, the builtins) hold, their public constants, and the exercises' records, taken
before the student's module is imported and compared after each exercise. A submission that replaces
`workbook.exercises.evaluate`, a check or `np.allclose` is graded wrong for it; one that patches and
restores within its own call is not seen.
"""

import os
import posix
import stat
import sys
import types

WRITE_EVENTS = {  # event: the positions of its path arguments that are written (a dir_fd, if any, comes last)
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
    "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.chflags": (0,),
    "os.lchflags": (0,), "os.utime": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "os.mkfifo": (0,),
    "os.mknod": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copymode": (1,),
    "shutil.copystat": (1,), "shutil.copytree": (1,), "shutil.move": (0, 1), "shutil.chown": (0,),
    "shutil.unpack_archive": (1,), "shutil.make_archive": (0,), "tempfile.mkstemp": (0,),
    "tempfile.mkdtemp": (0,),
}
DIR_FD_LAST = frozenset(("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.symlink",
                         "shutil.rmtree"))
TWO_DIR_FDS = frozenset(("os.rename", "os.link"))
READ_EVENTS = frozenset(("os.listdir", "os.scandir", "glob.glob", "glob.glob/2", "os.listxattr", "os.getxattr",
                         "shutil.copyfile", "shutil.copytree"))
SPAWN_EVENTS = frozenset(("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                          "os.forkpty", "os.startfile"))
REFUSED = frozenset(("ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.string_at",
                     "ctypes.wstring_at", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                     "sys.settrace", "sys.setprofile", "resource.setrlimit", "resource.prlimit", "os.killpg",
                     "signal.pthread_kill"))
TAKEN_AWAY = ("_posixsubprocess", "_testcapi", "_testinternalcapi", "_xxsubinterpreters")
FUNCTION_PARTS = frozenset(("__code__", "__defaults__", "__kwdefaults__"))
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
FILES_IN_WRITE = "files in write"  # a spawn's argv marker: its arguments are options or files under `write`


# Everything the hook uses is bound in its defaults (audited: they cannot be replaced) or is a method of a
# built-in type, so that a submission that rebinds a module's global (os.path.realpath, builtins.any)
# changes nothing the hook decides with.
def _resolve(path, _lstat=posix.lstat, _readlink=posix.readlink, _getcwd=posix.getcwd, _islink=stat.S_ISLNK,
             _error=OSError):
    """A path with every symbolic link followed, as the kernel would (os.path.realpath, from C parts)."""
    if not path.startswith("/"):
        path = _getcwd() + "/" + path
    todo, done, hops = path.split("/")[::-1], "", 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            done = done.rpartition("/")[0]
            continue
        candidate = done + "/" + part
        try:
            mode = _lstat(candidate).st_mode
        except _error:  # not there (yet): a file about to be made
            done = candidate
            continue
        if _islink(mode) and hops < 40:
            hops += 1
            target = _readlink(candidate)
            if target.startswith("/"):
                done = ""
            todo.extend(target.split("/")[::-1])
        else:
            done = candidate
    return done or "/"


def _where(path, dir_fd=None, _resolve=_resolve, _fspath=os.fspath, _readlink=posix.readlink, _bytes=bytes,
           _int=int, _type=type):
    """The resolved path an event names; None for a file descriptor."""
    if path is None or _type(path) is _int:
        return None
    path = _fspath(path)
    if _type(path) is _bytes:
        path = path.decode("utf-8", "replace")
    if dir_fd is not None and _type(dir_fd) is _int and not path.startswith("/"):
        path = _readlink(f"/proc/self/fd/{dir_fd}") + "/" + path
    return _resolve(path)


def _under(path, roots):
    if path is None:
        return True
    for root in roots:
        if path == root or path.startswith(root + "/"):
            return True
    return False


def _fspath_or(path, _fspath=os.fspath, _bytes=bytes, _type=type):
    path = _fspath(path)
    return path.decode("utf-8", "replace") if _type(path) is _bytes else path


def install(read, write, spawn=()):
    """Install the hook for the rest of this process's life. read, write: folders (and what is under
    them); spawn: (executable, argv) pairs that os.posix_spawn may start (argv a tuple, or
    FILES_IN_WRITE)."""
    write = tuple(_resolve(os.fspath(p)) for p in write)
    read = tuple(_resolve(os.fspath(p)) for p in read) + write + (f"/proc/{os.getpid()}", "/dev/null", "/dev/urandom")
    for name in TAKEN_AWAY:
        sys.modules[name] = None  # an import of it now fails before it reaches the file system
    if "subprocess" in sys.modules:
        sys.modules["subprocess"]._posixsubprocess = None

    def hook(event, args, _read=read, _write=write, _spawn=tuple(spawn), _pid=os.getpid(), _where=_where,
             _under=_under, _fspath_or=_fspath_or, _write_events=WRITE_EVENTS, _dir_fd_last=DIR_FD_LAST,
             _two_fds=TWO_DIR_FDS, _read_events=READ_EVENTS, _spawns=SPAWN_EVENTS, _refused=REFUSED,
             _taken=TAKEN_AWAY, _parts=FUNCTION_PARTS, _me=__name__, _flags=WRITE_FLAGS, _files=FILES_IN_WRITE,
             _devnull=os.devnull, _getattr=getattr, _str=str, _tuple=tuple, _type=type, _len=len, _all=all,
             _error=PermissionError):
        if event == "open":
            path, mode, flags = args
            writing = (_type(mode) is _str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or \
                (mode is None and (flags or 0) & _flags)
            if _under(_where(path), _write if writing else _read):
                return
        elif event in _write_events:
            def dir_fd(i):  # os.rename(src, dst, src_dir_fd, dst_dir_fd); os.remove(path, dir_fd)
                return args[-1] if event in _dir_fd_last else args[i + 2] if event in _two_fds else None

            if _all(_under(_where(args[i], dir_fd(i)), _write) for i in _write_events[event]):
                if event not in _read_events or _under(_where(args[0]), _read):
                    return
        elif event in _read_events:
            if _under(_where(args[0] if _len(args) and args[0] is not None else "."), _read):
                return
        elif event in _spawns:
            if event == "os.posix_spawn":
                executable, argv = _fspath_or(args[0]), _tuple(args[1])
                for allowed, pattern in _spawn:
                    if executable != allowed or not argv:
                        continue
                    if argv == pattern or (pattern == _files and _all(
                            a.startswith("-") or a == _devnull or _under(_where(a), _write) for a in argv[1:])):
                        return
        elif event == "os.kill":
            if args[0] in (0, _pid):
                return
        elif event == "import":
            if args[0] not in _taken:
                return
        elif event == "object.__setattr__":  # this module's functions keep their code and defaults
            if args[1] not in _parts or _getattr(args[0], "__module__", None) != _me:
                return
        elif event not in _refused and not event.startswith("socket."):
            return
        raise _error(f"refused while grading: {event} {args[0] if _len(args) else ''}"[:300])

    sys.addaudithook(hook)


# ---------------------------------------------------------------------------------------------
# The tripwire


WATCHED = ("workbook", "chapters", "numpy", "numba", "builtins", "math", "operator", "functools", "json")
KINDS = (types.FunctionType, types.BuiltinFunctionType, type, types.MethodType)
CONSTANTS = (int, float, str, bytes, tuple, frozenset, bool, type(None))


class Tripwire:
    """The grader's functions (their code, defaults and closures too), classes with their methods, public
    constants, and the attributes of `objects` (the Exercise records, whose `check` is the check), as
    they are now."""

    def __init__(self, skip=(), objects=()):
        self.taken = {}
        for name, module in list(sys.modules.items()):
            if module is None or name in skip or name.split(".")[0] not in WATCHED:
                continue
            for attribute, value in list(vars(module).items()):
                if isinstance(value, KINDS) or (isinstance(value, CONSTANTS) and not attribute.startswith("_")):
                    self.taken[f"{name}.{attribute}"] = (vars(module), attribute, _state(value))
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    for member, inner in list(vars(value).items()):
                        if isinstance(inner, (types.FunctionType, property, staticmethod, classmethod)):
                            self.taken[f"{name}.{attribute}.{member}"] = (value.__dict__, member, _state(inner))
        for item in objects:
            for attribute, value in list(vars(item).items()):
                self.taken[f"<{getattr(item, 'id', type(item).__name__)}>.{attribute}"] = (vars(item), attribute,
                                                                                          _state(value))

    def changed(self):
        """The names that no longer hold what they held: [] if none."""
        moved = []
        for label, (namespace, attribute, before) in self.taken.items():
            now = _state(namespace.get(attribute))
            if any(a is not b for a, b in zip(now, before)) and not (
                    isinstance(before[0], CONSTANTS) and type(now[0]) is type(before[0]) and now[0] == before[0]):
                moved.append(label)
        return moved


def _state(value):
    """What a value is, for the tripwire: itself, and for a function its code, defaults and closure."""
    if not isinstance(value, types.FunctionType):
        return (value,)
    cells = []
    for cell in value.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            cells.append(None)
    return (value, value.__code__, value.__defaults__, value.__kwdefaults__, *cells)

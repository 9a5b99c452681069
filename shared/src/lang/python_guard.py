# written by the fleet harness: the runner guard. Loaded by pytest (`-p fleet_guard`) before
# any code of the project is imported, it keeps a record, outside the worktree, of every attempt
# by the code under test to reach the runner, and of every change made to the runner's modules
# and classes during the run. A run whose record is missing, unfinished or names tampering is
# never a pass. Its configuration (`_CONF`) is written above this text by the harness.
import json as _json
import os as _os
import sys as _sys
import threading as _threading

# Audit events code under test may not raise (prefix match). Events raised by the import
# system on behalf of an `import` statement are judged by the `import` event alone.
_REFUSED = (
    "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
    "sys.addaudithook", "sys.excepthook", "sys.unraisablehook", "sys.monitoring",
    "object.__getattr__", "object.__setattr__", "object.__delattr__",
    "exec", "compile", "open", "os.", "subprocess.", "socket.", "gc.", "ctypes.",
    "marshal.", "pickle.", "code.__new__", "function.__new__", "builtins.input",
    "cpython.", "shutil.", "tempfile.", "glob.", "mmap.", "fcntl.", "pty.", "signal.",
    "sqlite3.", "webbrowser.", "urllib.", "http.", "ftplib.", "smtplib.", "msvcrt.",
    "winreg.", "_winapi.", "resource.", "syslog.", "posix.",
)


def _open_record(path):
    flags = _os.O_WRONLY | _os.O_CREAT | _os.O_APPEND | getattr(_os, "O_CLOEXEC", 0)
    return _os.open(path, flags, 0o600)


def _install(conf):
    fd = _open_record(conf["record"])
    nonce = conf["nonce"]
    work = conf["work"].rstrip("/") + "/"
    tests = tuple(t.rstrip("/") + "/" for t in conf["tests"])
    test_files = frozenset(conf["test_files"])
    try:
        entries = _os.listdir(work)
    except OSError:
        entries = []
    # The project's own modules, but not its tests'.
    local = frozenset(e[:-3] if e.endswith(".py") else e for e in entries
                      if not any((work + e + "/").startswith(t) for t in tests)
                      and work + e not in test_files)
    allowed = frozenset(conf["allowed_modules"]) | local
    allowed_events = tuple(conf.get("allowed_events", ()))
    _os.write(fd, ("start " + nonce + "\n").encode())

    def write(line, _w=_os.write, _fd=fd, _n=nonce):
        try:
            _w(_fd, ("tamper " + _n + " " + line.replace("\n", " ")[:400] + "\n").encode())
        except Exception:
            pass

    written = frozenset(conf.get("code_under_test") or ())

    def product(filename, _work=work, _tests=tests, _files=test_files, _written=written):
        if _written:
            return filename in _written
        if not filename.startswith(_work) or filename in _files:
            return False
        base = filename.rsplit("/", 1)[-1]
        if base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py":
            return False
        return not any(filename.startswith(t) for t in _tests)

    # `*` (the policy on code under test turned off by the spec) allows every import but the
    # runner's own modules, as the static policy then does; the runner's state is still
    # compared and its modules never imported by code under test.
    anything = "*" in allowed
    runner = ("_pytest", "pytest", "pluggy", "py", "_py", "fleet_")

    def allowed_import(name, _allowed=allowed, _anything=anything, _runner=runner):
        top = name.split(".")[0]
        if _anything:
            return not (top in _runner or top.startswith("fleet_"))
        return name in _allowed or top in _allowed

    local = _threading.local()

    def hook(event, args, _local=local, _frame=_sys._getframe, _product=product,
             _write=write, _refused=_REFUSED, _allowed_events=allowed_events,
             _allowed_import=allowed_import):
        if getattr(_local, "busy", False):
            return
        if event != "import" and not event.startswith(_refused):
            return
        if event.startswith(_allowed_events):
            return
        _local.busy = True
        try:
            frame = _frame(1)
            in_import = False
            while frame is not None:
                name = frame.f_code.co_filename
                if name.startswith("<frozen importlib"):
                    in_import = True
                    frame = frame.f_back
                    continue
                break
            if frame is None:
                return
            culprit = frame.f_code.co_filename
            if not _product(culprit):
                return
            if event == "import":
                module = args[0] if args else ""
                if isinstance(module, str) and _allowed_import(module):
                    return
                what = "import of " + repr(module)
            elif in_import:
                return
            else:
                what = event + " " + repr(args)[:160]
            line = frame.f_lineno
        finally:
            _local.busy = False
        _write(what + " by " + culprit + ":" + str(line))
        raise RuntimeError("refused by the fleet runner guard: " + what)

    _sys.addaudithook(hook)
    return fd, write


_FD, _WRITE = _install(_CONF)

# The runner's state, taken before the project's code is imported and compared after.
_WATCHED = ("_pytest", "pytest", "pluggy", "fleet_", "builtins", "py", "_py")
# Attributes the runner itself changes while it runs.
_VOLATILE = frozenset((
    "_pytest.assertion.util._reprcompare", "_pytest.assertion.util._assertion_pass",
    "_pytest.assertion.util._config", "builtins._",
    "_pytest.debugging.pytestPDB._config", "_pytest.debugging.pytestPDB._pluginmanager",
    "_pytest.debugging.pytestPDB._recursive_debug", "_pytest.debugging.pytestPDB._saved",
    "_pytest.config.Config._getini_unknown_type",
))


def _watched(name):
    return name.split(".")[0] in _WATCHED or name.startswith("fleet_")


# What a test's run goes through: compared after every test (the rest after collection and
# at the end).
_HOT = ("_pytest.python", "_pytest.runner", "_pytest.reports", "_pytest.junitxml",
        "_pytest.outcomes", "_pytest.terminal", "_pytest.main", "_pytest.fixtures",
        "_pytest.nodes", "_pytest.skipping", "pluggy", "builtins")


def _shot(hot=False, _modules=_sys.modules, _s=_sys, _hot=_HOT):
    seen = {
        "sys.meta_path": tuple(map(id, _s.meta_path)),
        "sys.path_hooks": tuple(map(id, _s.path_hooks)),
        "sys.excepthook": id(_s.excepthook),
        "sys.gettrace()": id(_s.gettrace()),
        "sys.getprofile()": id(_s.getprofile()),
        "sys.modules": id(_modules),
    }
    for mname, mod in list(_modules.items()):
        if mod is None or not _watched(mname):
            continue
        if hot and not mname.startswith(_hot):
            continue
        seen["sys.modules[" + mname + "]"] = id(mod)
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for attr, value in items:
            key = mname + "." + attr
            if key in _VOLATILE or attr.startswith("__"):
                continue
            seen[key] = id(value)
            if isinstance(value, type) and getattr(value, "__module__", "") == mname:
                for cattr, cvalue in list(vars(value).items()):
                    if cattr.startswith("__") and cattr not in ("__call__", "__init__", "__new__"):
                        continue
                    if key + "." + cattr not in _VOLATILE:
                        seen[key + "." + cattr] = id(cvalue)
    return seen


def _compare(before, when, hot=False, _write=_WRITE, _told=set()):
    now = _shot(hot)
    changed = [k for k, v in now.items() if k in before and before[k] != v and k not in _told]
    if not hot:
        changed += [k for k in before if k not in now and k not in _told]
    for key in sorted(changed)[:20]:
        _told.add(key)
        _write("runner changed (seen at " + when + "): " + key)
    return not changed


_STATE = {"before": _shot()}


def pytest_configure(config):
    # Modules the runner loaded since: their state as it is before any test module is read.
    for key, value in _shot().items():
        _STATE["before"].setdefault(key, value)


def pytest_collection_finish(session):
    _compare(_STATE.get("before", {}), "collection")


def pytest_runtest_logreport(report, _per_test=_CONF.get("per_test", True)):
    if report.when == "call" and _per_test:
        _compare(_STATE.get("before", {}), report.nodeid, hot=True)


def pytest_unconfigure(config, _fd=_FD, _w=_os.write, _n=_CONF["nonce"]):
    _compare(_STATE.get("before", {}), "end")
    _w(_fd, ("end " + _n + "\n").encode())

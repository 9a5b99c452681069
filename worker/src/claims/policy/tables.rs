//! The Python policy's lists: what code under test may import, call and reach by default.
//! Everything not listed here is refused; a spec or work order widens the lists by name.

/// Modules code under test may import (one list with the runner guard, kept in `shared::lang`): the pure part of the standard library (numbers, text,
/// data structures, dates, encodings). Nothing that reaches files, processes, the network, the
/// interpreter (`sys`, `inspect`, `types`, `gc`, `importlib`), the test framework or the
/// process's global output (`warnings`, `logging`). A dotted module (`collections.abc`) is
/// allowed only when listed itself.
pub use shared::lang::PYTHON_ALLOWED_MODULES as ALLOWED_MODULES;

/// Names inside allowed modules that reach attributes by a computed name, evaluate strings, or
/// change the process's global state.
pub const REFUSED_NAMES: &[&str] = &[
    "operator.attrgetter",
    "operator.methodcaller",
    "typing.get_type_hints",
    "typing.ForwardRef",
    "typing.evaluate_forward_ref",
    "functools.singledispatch",
    "functools.singledispatchmethod",
    "string.Formatter",
    "contextlib.redirect_stdout",
    "contextlib.redirect_stderr",
    "contextlib.chdir",
];

/// Other modules of the standard library (and the test framework's). An allowed module that
/// imported one of them exposes it as an attribute (`typing.sys`, `dataclasses.inspect`): a
/// segment naming one of these after an allowed module is refused.
pub const KNOWN_MODULES: &[&str] = &[
    "_pytest",
    "annotationlib",
    "argparse",
    "ast",
    "asyncio",
    "atexit",
    "bdb",
    "builtins",
    "bz2",
    "code",
    "codecs",
    "codeop",
    "concurrent",
    "configparser",
    "contextvars",
    "copyreg",
    "ctypes",
    "dbm",
    "dis",
    "doctest",
    "email",
    "errno",
    "faulthandler",
    "fcntl",
    "filecmp",
    "fileinput",
    "fnmatch",
    "ftplib",
    "gc",
    "getopt",
    "getpass",
    "glob",
    "grp",
    "gzip",
    "http",
    "imp",
    "importlib",
    "inspect",
    "io",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "marshal",
    "mmap",
    "multiprocessing",
    "nt",
    "ntpath",
    "opcode",
    "os",
    "pathlib",
    "pdb",
    "pickle",
    "pkgutil",
    "platform",
    "posix",
    "posixpath",
    "pprint",
    "pty",
    "pwd",
    "py",
    "pytest",
    "queue",
    "resource",
    "runpy",
    "sched",
    "select",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "site",
    "sitecustomize",
    "socket",
    "sqlite3",
    "ssl",
    "stat",
    "subprocess",
    "sys",
    "sysconfig",
    "tarfile",
    "tempfile",
    "usercustomize",
    "threading",
    "token",
    "tokenize",
    "trace",
    "traceback",
    "tracemalloc",
    "types",
    "unittest",
    "urllib",
    "uuid",
    "warnings",
    "weakref",
    "webbrowser",
    "xml",
    "zipapp",
    "zipfile",
    "zipimport",
    "zoneinfo",
];

/// Builtins code under test may use (besides the standard exceptions below).
pub const ALLOWED_BUILTINS: &[&str] = &[
    "abs",
    "aiter",
    "all",
    "anext",
    "any",
    "ascii",
    "bin",
    "bool",
    "bytearray",
    "bytes",
    "callable",
    "chr",
    "classmethod",
    "complex",
    "dict",
    "divmod",
    "enumerate",
    "filter",
    "float",
    "format",
    "frozenset",
    "hash",
    "hex",
    "id",
    "int",
    "isinstance",
    "issubclass",
    "iter",
    "len",
    "list",
    "map",
    "max",
    "min",
    "next",
    "object",
    "oct",
    "ord",
    "pow",
    "print",
    "property",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "slice",
    "sorted",
    "staticmethod",
    "str",
    "sum",
    "super",
    "tuple",
    "type",
    "zip",
    "NotImplemented",
    "Ellipsis",
    // module globals the interpreter binds
    "__name__",
    "__doc__",
    "__debug__",
    "__module__",
    "__qualname__",
];

/// The standard exceptions and warnings code under test may raise and catch. Not
/// `BaseException`, `SystemExit`, `KeyboardInterrupt` (ending or interrupting the runner).
pub const ALLOWED_EXCEPTIONS: &[&str] = &[
    "ArithmeticError",
    "AssertionError",
    "AttributeError",
    "BlockingIOError",
    "BrokenPipeError",
    "BufferError",
    "BytesWarning",
    "ChildProcessError",
    "ConnectionAbortedError",
    "ConnectionError",
    "ConnectionRefusedError",
    "ConnectionResetError",
    "DeprecationWarning",
    "EncodingWarning",
    "EnvironmentError",
    "EOFError",
    "Exception",
    "ExceptionGroup",
    "FileExistsError",
    "FileNotFoundError",
    "FloatingPointError",
    "FutureWarning",
    "GeneratorExit",
    "ImportError",
    "ImportWarning",
    "IndentationError",
    "IndexError",
    "InterruptedError",
    "IOError",
    "IsADirectoryError",
    "KeyError",
    "LookupError",
    "MemoryError",
    "ModuleNotFoundError",
    "NameError",
    "NotADirectoryError",
    "NotImplementedError",
    "OSError",
    "OverflowError",
    "PendingDeprecationWarning",
    "PermissionError",
    "ProcessLookupError",
    "RecursionError",
    "ReferenceError",
    "ResourceWarning",
    "RuntimeError",
    "RuntimeWarning",
    "StopAsyncIteration",
    "StopIteration",
    "SyntaxError",
    "SyntaxWarning",
    "SystemError",
    "TabError",
    "TimeoutError",
    "TypeError",
    "UnboundLocalError",
    "UnicodeDecodeError",
    "UnicodeEncodeError",
    "UnicodeError",
    "UnicodeTranslateError",
    "UnicodeWarning",
    "UserWarning",
    "ValueError",
    "Warning",
    "ZeroDivisionError",
];

/// Builtins (and interpreter-bound globals) that are refused; named apart so a refusal says
/// `builtin_not_allowed` rather than `unbound_name`. A file may define its own function of such
/// a name (a module-level `def` or `class`), never bind one by assignment or parameter.
pub const REFUSED_BUILTINS: &[&str] = &[
    "eval",
    "exec",
    "compile",
    "open",
    "input",
    "breakpoint",
    "globals",
    "locals",
    "vars",
    "__import__",
    "memoryview",
    "dir",
    "exit",
    "quit",
    "help",
    "copyright",
    "credits",
    "license",
    "BaseException",
    "BaseExceptionGroup",
    "SystemExit",
    "KeyboardInterrupt",
    "__build_class__",
    "__builtins__",
    "__file__",
    "__loader__",
    "__spec__",
    "__cached__",
    "__package__",
    "__path__",
];

/// Builtins that look an attribute up by name: allowed only called directly with a string
/// literal name that does not start with `_` (and is no interpreter internal).
pub const ATTRIBUTE_BUILTINS: &[&str] = &["getattr", "hasattr", "setattr", "delattr"];

/// Dunder names code may reach as attributes or write in strings: the data model's methods and
/// harmless metadata. Never `__class__`, `__dict__`, `__globals__`, `__subclasses__`,
/// `__builtins__`, `__code__`, `__traceback__`, `__mro__`, `__bases__`, `__self__`,
/// `__getattribute__`...
pub const ALLOWED_DUNDERS: &[&str] = &[
    "__init__",
    "__new__",
    "__post_init__",
    "__repr__",
    "__str__",
    "__format__",
    "__bytes__",
    "__hash__",
    "__bool__",
    "__len__",
    "__length_hint__",
    "__iter__",
    "__next__",
    "__reversed__",
    "__contains__",
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__missing__",
    "__call__",
    "__enter__",
    "__exit__",
    "__aenter__",
    "__aexit__",
    "__aiter__",
    "__anext__",
    "__await__",
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__neg__",
    "__pos__",
    "__abs__",
    "__invert__",
    "__complex__",
    "__int__",
    "__float__",
    "__index__",
    "__round__",
    "__trunc__",
    "__floor__",
    "__ceil__",
    "__copy__",
    "__deepcopy__",
    "__name__",
    "__qualname__",
    "__doc__",
    "__module__",
    "__main__",
    "__slots__",
    "__all__",
    "__version__",
    "__match_args__",
    "__init_subclass__",
    "__class_getitem__",
    "__set_name__",
    "__get__",
    "__set__",
    "__delete__",
    "__future__",
    "__debug__",
];

/// Binary operators whose `__op__`, `__rop__` and `__iop__` methods are allowed dunders.
pub const OPERATOR_DUNDERS: &[&str] = &[
    "add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow", "lshift",
    "rshift", "and", "xor", "or",
];

/// Attributes of frames, generators, coroutines, tracebacks and code objects: a route to other
/// frames' globals without a dunder.
pub const INTERNAL_ATTRIBUTES: &[&str] = &[
    "f_globals",
    "f_locals",
    "f_builtins",
    "f_back",
    "f_code",
    "f_trace",
    "f_lasti",
    "gi_frame",
    "gi_code",
    "gi_yieldfrom",
    "cr_frame",
    "cr_code",
    "cr_await",
    "ag_frame",
    "ag_code",
    "ag_await",
    "tb_frame",
    "tb_next",
    "co_code",
    "co_consts",
    "co_names",
];

/// Is `name` an allowed dunder (listed, or an operator method)?
pub fn allowed_dunder(name: &str) -> bool {
    if ALLOWED_DUNDERS.contains(&name) {
        return true;
    }
    let Some(inner) = name.strip_prefix("__").and_then(|n| n.strip_suffix("__")) else {
        return false;
    };
    let op = inner
        .strip_prefix('r')
        .filter(|o| OPERATOR_DUNDERS.contains(o))
        .or_else(|| {
            inner
                .strip_prefix('i')
                .filter(|o| OPERATOR_DUNDERS.contains(o))
        })
        .unwrap_or(inner);
    OPERATOR_DUNDERS.contains(&op)
}

/// `__x__` with something between the underscores.
pub fn is_dunder(name: &str) -> bool {
    name.len() > 4 && name.starts_with("__") && name.ends_with("__")
}

pub fn allowed_builtin(name: &str) -> bool {
    ALLOWED_BUILTINS.contains(&name) || ALLOWED_EXCEPTIONS.contains(&name)
}

pub fn allowed_module(name: &str) -> bool {
    ALLOWED_MODULES.contains(&name)
}

/// A module name of the standard library that is not allowed.
pub fn known_module(name: &str) -> bool {
    KNOWN_MODULES.contains(&name) && !allowed_module(name)
}

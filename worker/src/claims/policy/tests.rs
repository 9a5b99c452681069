use super::*;

fn check(src: &str, allow: &[&str]) -> Result<Vec<Forbidden>, String> {
    let allowances = Allowances {
        allow: allow.iter().map(|s| s.to_string()).collect(),
        local_modules: Default::default(),
    };
    python_refusals(src, &allowances)
}

fn refusals(src: &str) -> Vec<Forbidden> {
    check(src, &[]).unwrap()
}

fn names(src: &str) -> Vec<String> {
    refusals(src).into_iter().map(|f| f.name).collect()
}

fn refuses(src: &str, name: &str) {
    let found = names(src);
    assert!(
        found.iter().any(|n| n == name),
        "`{name}` refused in {src:?}: {found:?}"
    );
}

fn passes(src: &str) {
    assert_eq!(refusals(src), Vec::<Forbidden>::new(), "{src}");
}

// The deny-list's cases, kept: what it refused is still refused.

#[test]
fn an_honest_stack_references_nothing_forbidden() {
    passes("class Stack:\n    def __init__(self):\n        self._items = []\n\n    def pop(self):\n        if not self._items:\n            raise IndexError('pop from an empty stack')\n        return self._items.pop()\n");
}

#[test]
fn the_runners_process_is_out_of_reach_even_through_aliases() {
    refuses("import sys\nx = sys.argv[1]\n", "sys.argv");
    refuses("import sys as s\nx = s.argv\n", "sys.argv");
    refuses("from sys import argv\n", "sys.argv");
    let exits: Vec<_> = refusals("from os import _exit as e\ne(0)\n")
        .into_iter()
        .filter(|f| f.name == "os._exit")
        .map(|f| f.line)
        .collect();
    assert_eq!(exits, vec![1, 2]);
    refuses("import os\nos.execv('/bin/true', [])\n", "os.execv");
    refuses("import _pytest.python\n", "_pytest.python");
    refuses("import atexit\n", "atexit");
    refuses(
        "def f():\n    return open('/fleet/out/report.xml')\n",
        "open",
    );
    refuses("x = getattr(object, '_y')\n", "getattr");
    assert!(!names("x = ().__class__.__bases__[0].__subclasses__()\n").is_empty());
}

#[test]
fn a_builtin_rebound_by_a_parameter_is_still_the_builtin() {
    // `input` bound only as a parameter: the default policy will not trust the shadow.
    let hits = refusals("def open(self, input=1):\n    return input\n");
    assert_eq!(
        hits.iter()
            .map(|f| (f.name.as_str(), f.rule.as_str(), f.line))
            .collect::<Vec<_>>(),
        vec![
            ("input", "builtin_not_allowed", 1),
            ("input", "builtin_not_allowed", 2)
        ]
    );
    passes("def f(**kw):\n    return kw\n\n\nf(input=2)\n");
    refuses("def f(x=eval):\n    return x\n", "eval");
    refuses("def f(eval=eval):\n    return eval('1')\n", "eval");
    refuses("open = open\nopen('x')\n", "open");
}

#[test]
fn unparsable_source_is_an_error() {
    assert!(check("def f(:\n", &[]).is_err());
}

// Attacks: each must be refused, by a rule that names what it reached for, on its line.

#[test]
fn reflection_through_operator_with_a_computed_name_is_refused() {
    let src = "import operator\n\nname = 'run' + 'test'\nget = operator.attrgetter(name)\n";
    let hits = refusals(src);
    assert!(
        hits.contains(&Forbidden {
            name: "operator.attrgetter".into(),
            rule: "name_not_allowed".into(),
            line: 4
        }),
        "{hits:?}"
    );
    refuses(
        "from operator import methodcaller as m\nm('runtest')\n",
        "operator.methodcaller",
    );
    refuses(
        "import typing\ntyping.get_type_hints(f)\n",
        "typing.get_type_hints",
    );
    refuses(
        "from functools import singledispatch\n",
        "functools.singledispatch",
    );
    refuses("import string\nstring.Formatter()\n", "string.Formatter");
}

#[test]
fn import_through_a_string_is_refused() {
    refuses("m = __builtins__['__import__']('os')\n", "__builtins__");
    refuses("m = __builtins__['__import__']('os')\n", "__import__");
    refuses("m = __import__('os')\n", "__import__");
    refuses(
        "import importlib\nimportlib.import_module('os')\n",
        "importlib",
    );
}

#[test]
fn the_interpreters_module_table_is_refused_however_reached() {
    refuses("import sys\nsys.modules['_pytest'].x = 1\n", "sys.modules");
    refuses("import typing\ntyping.sys.modules\n", "typing.sys");
    refuses("from dataclasses import inspect\n", "dataclasses.inspect");
    refuses(
        "import reprlib\nreprlib.builtins.eval\n",
        "reprlib.builtins",
    );
}

#[test]
fn private_names_of_imported_modules_are_refused() {
    let hits = refusals("import random\n\nrandom._os.system('true')\n");
    assert_eq!(
        hits,
        vec![Forbidden {
            name: "random._os".into(),
            rule: "private_name".into(),
            line: 3
        }]
    );
    refuses("from random import _os\n", "random._os");
    // A module held in a variable would dodge the check on its attributes.
    refuses("import random\nr = random\nr._os\n", "random");
}

#[test]
fn format_strings_reaching_dunders_or_computed_formats_are_refused() {
    refuses(
        "def f(x):\n    return '{0.__class__}'.format(x)\n",
        "__class__",
    );
    refuses(
        "def f(x):\n    return ('{0.__cla' 'ss__}').format(x)\n",
        "__class__",
    );
    refuses(
        "def f(x):\n    return '{0.\\x5f_class__}'.format(x)\n",
        "__class__",
    );
    refuses("def f(s, x):\n    return s.format(x)\n", "format");
    refuses("def f(x):\n    return str.format('{0}', x)\n", "format");
    refuses(
        "def f(g):\n    return '{0.gi_frame}'.format(g)\n",
        "gi_frame",
    );
    passes("def f(x):\n    return '{0} and {1!r:>4}'.format(x, x)\n");
}

#[test]
fn attribute_lookups_by_computed_name_are_refused() {
    let hits = refusals("def f(x, name):\n    return getattr(x, name)\n");
    assert_eq!(
        hits,
        vec![Forbidden {
            name: "getattr".into(),
            rule: "computed_attribute".into(),
            line: 2
        }]
    );
    refuses("g = getattr\n", "getattr");
    refuses(
        "def f(x):\n    return list(map(getattr, [x], ['a']))\n",
        "getattr",
    );
    refuses("def f(x):\n    return getattr(x, '__dict__')\n", "getattr");
    refuses("def f(x):\n    return getattr(x, f'{x}')\n", "getattr");
    refuses("def f(g):\n    return getattr(g, 'gi_frame')\n", "getattr");
    refuses("def f(x):\n    setattr(x, '_secret', 1)\n", "setattr");
    passes("def f(x):\n    setattr(x, 'size', 1)\n    return getattr(x, 'size', 0) + hasattr(x, 'y')\n");
}

#[test]
fn namespaces_and_dunders_are_refused() {
    refuses("def f():\n    return vars()\n", "vars");
    refuses("def f():\n    return globals()\n", "globals");
    refuses("def f(x):\n    return type(x).__dict__\n", "__dict__");
    refuses("def f(x):\n    return x.__self__\n", "__self__");
    refuses("def f(g):\n    return g.gi_frame.f_globals\n", "gi_frame");
    refuses(
        "def f(x):\n    return object.__getattribute__(x, 'y')\n",
        "__getattribute__",
    );
    refuses(
        "class P:\n    __match_args__ = ('__class__',)\n",
        "__class__",
    );
    refuses("def f():\n    return __file__\n", "__file__");
    refuses("raise SystemExit(0)\n", "SystemExit");
    refuses(
        "def f():\n    return undefined_thing()\n",
        "undefined_thing",
    );
    refuses(
        "def f(x):\n    match x:\n        case eval():\n            return eval('1')\n",
        "eval",
    );
}

#[test]
fn imports_outside_the_allowed_set_are_refused_and_widened_by_name() {
    let hits = refusals("import json\nimport os\n");
    assert_eq!(
        hits,
        vec![Forbidden {
            name: "os".into(),
            rule: "module_not_allowed".into(),
            line: 2
        }]
    );
    refuses("from math import *\n", "math.*");
    let allow = |a: &[&str], src: &str| check(src, a).unwrap();
    assert!(allow(&["os"], "import os\nx = os.environ\n").is_empty());
    assert!(allow(&["open"], "def f():\n    return open('a')\n").is_empty());
    assert!(!allow(&["open"], "import os\n").is_empty());
    assert!(allow(PYTHON_ALLOW_ALL, "import sys\nsys.exit(0)\n").is_empty());
}

#[test]
fn local_modules_and_relative_imports_are_the_projects_own() {
    let src = "from stack import Stack\nfrom . import helpers\nfrom .util import _private\n";
    let local = Allowances {
        allow: Vec::new(),
        local_modules: ["stack".to_string()].into(),
    };
    assert_eq!(python_refusals(src, &local).unwrap(), Vec::new());
    refuses(src, "stack.Stack");
    refuses(
        "from . import helpers\nhelpers.sys.modules\n",
        ".helpers.sys",
    );
}

// Honest code: every form of binding, the modules it needs.

#[test]
fn honest_code_passes() {
    passes(
        "from dataclasses import dataclass, field\nfrom typing import Optional\n\n\n@dataclass\nclass Item:\n    name: str\n    tags: list = field(default_factory=list)\n    parent: Optional['Item'] = None\n\n    def __post_init__(self):\n        self.name = self.name.strip()\n",
    );
    passes(
        "import math\nfrom functools import reduce\nimport operator as op\n\n\ndef product(xs):\n    return reduce(op.mul, xs, 1)\n\n\ndef hyp(a, b):\n    return math.sqrt(a * a + b * b)\n",
    );
    passes(
        "class Base:\n    def __init__(self, n):\n        self.n = n\n\n\nclass Child(Base):\n    def __init__(self, n, *args, **kwargs):\n        super().__init__(n)\n        self.extra = [a for a in args if a]\n\n    def __eq__(self, other):\n        return isinstance(other, Child) and self.n == other.n\n\n    def __repr__(self):\n        return f'{type(self).__name__}({self.n!r})'\n",
    );
    passes(
        "import re\nimport collections.abc\nfrom enum import Enum\n\nTOTAL = 0\n\n\nclass Color(Enum):\n    RED = 1\n\n\ndef scan(text, /, *, strict=False):\n    global TOTAL\n    counts = {}\n    for i, (k, v) in enumerate(re.findall(r'(\\w+)=(\\w+)', text)):\n        counts[k] = counts.get(k, 0) + i\n    with_lambda = sorted(counts, key=lambda key: counts[key])\n    try:\n        if (n := len(with_lambda)) > 3:\n            TOTAL += n\n    except (KeyError, ValueError) as err:\n        raise RuntimeError(str(err)) from err\n    match Color.RED:\n        case Color.RED:\n            pass\n        case [first, *rest]:\n            print(first, rest)\n        case {'k': value}:\n            print(value)\n        case str() as s:\n            print(s)\n    return isinstance(text, collections.abc.Sized)\n\n\nif __name__ == '__main__':\n    print(scan('a=b'))\n",
    );
}

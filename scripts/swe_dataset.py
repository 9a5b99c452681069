#!/usr/bin/env python3
"""Builds a small SWE-bench-style dataset from toolz's published sdist (standard library only).

Run through scripts/build-swe-dataset.sh, which says what is written where. Every step is
deterministic (fixed commit authors and dates), so two builds give the same commits and the
same dataset bytes. The sdist is downloaded once into the cache and checked against the pinned
sha256 every time it is used.
"""

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request

PACKAGE = "toolz"
VERSION = "1.2.0"
SDIST = f"{PACKAGE}-{VERSION}.tar.gz"
SHA256 = "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490"
INDEX = os.environ.get("FLEET_PYPI_URL", "https://pypi.org").rstrip("/")
REPO = f"pypi/{PACKAGE}"
MIRROR = REPO.replace("/", "__")
DATE = "2026-01-01T00:00:00+00:00"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "fleet dataset",
    "GIT_AUTHOR_EMAIL": "dataset@fleet.invalid",
    "GIT_COMMITTER_NAME": "fleet dataset",
    "GIT_COMMITTER_EMAIL": "dataset@fleet.invalid",
    "GIT_AUTHOR_DATE": DATE,
    "GIT_COMMITTER_DATE": DATE,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "LC_ALL": "C",
}

# One injected bug per instance: `before` -> `after` in `file` (exactly one occurrence) is the
# bug; the gold patch is its reverse. The test patch adds `tests` at the end of `test_file`
# (and `imports` after its first line, when given); `fail_to_pass` are the new tests that catch
# the bug, `new_pass_to_pass` new tests that pass either way. PASS_TO_PASS is every test the
# test file already had (read from its syntax tree) plus `new_pass_to_pass`.
BUGS = [
    {
        "n": 1,
        "file": "toolz/itertoolz.py",
        "before": "    if initial == no_default:\n",
        "after": "    if initial == no_default or not initial:\n",
        "subject": "accumulate: a falsy initial value is treated as no initial value",
        "problem": (
            "`accumulate` drops a falsy `initial` value\n\n"
            "`list(accumulate(add, [1, 2, 3], 0))` returns `[1, 3, 6]`; it should start with the "
            "initial value, `[0, 1, 3, 6]`, as it does for `-1`. The same happens with `''` and "
            "`()`, and `list(accumulate(add, [], 0))` gives `[]` instead of `[0]`. Only a missing "
            "`initial` should mean \"start from the first element\".\n"
        ),
        "test_file": "toolz/tests/test_itertoolz.py",
        "imports": "import pytest\n",
        "tests": (
            "\n\n@pytest.mark.parametrize(\"initial, seq, expected\", [\n"
            "    (0, [1, 2, 3], [0, 1, 3, 6]),\n"
            "    (\"\", [\"a\", \"b\"], [\"\", \"a\", \"ab\"]),\n"
            "    ((), [(1,), (2,)], [(), (1,), (1, 2)]),\n"
            "], ids=[\"int\", \"str\", \"tuple\"])\n"
            "def test_accumulate_keeps_a_falsy_initial_value(initial, seq, expected):\n"
            "    assert list(accumulate(add, seq, initial)) == expected\n\n\n"
            "def test_accumulate_of_nothing_with_a_falsy_initial_value():\n"
            "    assert list(accumulate(add, [], 0)) == [0]\n"
        ),
        "fail_to_pass": [
            "test_accumulate_keeps_a_falsy_initial_value[int]",
            "test_accumulate_keeps_a_falsy_initial_value[str]",
            "test_accumulate_keeps_a_falsy_initial_value[tuple]",
            "test_accumulate_of_nothing_with_a_falsy_initial_value",
        ],
        "new_pass_to_pass": [],
    },
    {
        "n": 2,
        "file": "toolz/dicttoolz.py",
        "before": "            dtemp = factory()\n            dtemp.update(d)\n",
        "after": "            dtemp = d\n",
        "subject": "update_in: reuse the nested mapping instead of copying it",
        "problem": (
            "`update_in` and `assoc_in` modify nested input dictionaries\n\n"
            "```python\nd = {'a': {'b': 1}}\nupdate_in(d, ['a', 'b'], lambda x: x + 10)\n"
            "d  # {'a': {'b': 11}}: the input changed\n```\n\n"
            "The docstring promises that `update_in` \"does not mutate the original "
            "dictionary\", but every nested level it walks through is shared with the input "
            "and changed in place.\n"
        ),
        "test_file": "toolz/tests/test_dicttoolz.py",
        "imports": None,
        "tests": (
            "\n\ndef test_update_in_leaves_the_nested_input_untouched():\n"
            "    d = {\"a\": {\"b\": 1, \"c\": 2}}\n"
            "    assert update_in(d, [\"a\", \"b\"], inc) == {\"a\": {\"b\": 2, \"c\": 2}}\n"
            "    assert d == {\"a\": {\"b\": 1, \"c\": 2}}\n\n\n"
            "def test_assoc_in_copies_every_level_it_changes():\n"
            "    d = {\"x\": {\"y\": {\"z\": 0}}}\n"
            "    d2 = assoc_in(d, [\"x\", \"y\", \"z\"], 1)\n"
            "    assert d[\"x\"][\"y\"][\"z\"] == 0\n"
            "    assert d2[\"x\"][\"y\"][\"z\"] == 1\n"
            "    assert d2[\"x\"] is not d[\"x\"]\n"
        ),
        "fail_to_pass": [
            "test_update_in_leaves_the_nested_input_untouched",
            "test_assoc_in_copies_every_level_it_changes",
        ],
        "new_pass_to_pass": [],
    },
    {
        "n": 3,
        "file": "toolz/dicttoolz.py",
        "before": "    except (KeyError, IndexError, TypeError):\n",
        "after": "    except (KeyError, TypeError):\n",
        "subject": "get_in: catch only the lookup errors of mappings",
        "problem": (
            "`get_in` raises IndexError instead of returning the default\n\n"
            "`get_in(['items', 10], {'items': ['apple']})` raises `IndexError: list index out "
            "of range`. The docstring says a path that cannot be found returns `default` (None "
            "unless given) and only raises with `no_default=True`; that holds for missing keys "
            "but not for indexes past the end of a list.\n"
        ),
        "test_file": "toolz/tests/test_dicttoolz.py",
        "imports": None,
        "tests": (
            "\n\nclass TestGetInSequences:\n"
            "    def test_an_index_past_the_end_gives_the_default(self):\n"
            "        data = {\"items\": [\"apple\", \"orange\"]}\n"
            "        assert get_in([\"items\", 10], data) is None\n"
            "        assert get_in([\"items\", 10], data, default=\"none\") == \"none\"\n\n"
            "    def test_an_index_past_the_end_raises_without_a_default(self):\n"
            "        assert raises(IndexError,\n"
            "                      lambda: get_in([\"items\", 5], {\"items\": []}, no_default=True))\n"
        ),
        "fail_to_pass": ["TestGetInSequences::test_an_index_past_the_end_gives_the_default"],
        "new_pass_to_pass": ["TestGetInSequences::test_an_index_past_the_end_raises_without_a_default"],
    },
    {
        "n": 4,
        "file": "toolz/functoolz.py",
        "before": (
            "            args = (val,) + args\n            return func(*args)\n"
            "    return reduce(evalform_front, forms, val)\n"
        ),
        "after": (
            "            args = args + (val,)\n            return func(*args)\n"
            "    return reduce(evalform_front, forms, val)\n"
        ),
        "subject": "thread_first: build the call's arguments like thread_last",
        "problem": (
            "`thread_first` passes the value last in tuple forms\n\n"
            "`thread_first(2, (pow, 3))` returns 9 (`pow(3, 2)`); it should be `pow(2, 3) == 8`, "
            "the value threaded in as the first argument. Commutative functions such as `add` "
            "hide it.\n"
        ),
        "test_file": "toolz/tests/test_functoolz.py",
        "imports": None,
        "tests": (
            "\n\ndef test_thread_first_passes_the_value_as_the_first_argument():\n"
            "    assert thread_first(2, (pow, 3)) == 8\n"
            "    assert thread_first(7, (divmod, 2)) == (3, 1)\n"
        ),
        "fail_to_pass": ["test_thread_first_passes_the_value_as_the_first_argument"],
        "new_pass_to_pass": [],
    },
]

AGENTS = ("gold", "wrong", "scope", "testfile")
EXPECTED = {
    "gold": {"verdict": "PASS", "ended_stage": "success"},
    "wrong": {"verdict": "FAIL", "ended_stage": "acceptance_failed"},
    "scope": {"verdict": "FAIL", "ended_stage": "patch_scope_violation"},
    "testfile": {"verdict": "FAIL", "ended_stage": "patch_scope_violation"},
}


def fail(message):
    print(f"build-swe-dataset: {message}", file=sys.stderr)
    sys.exit(1)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            h.update(block)
    return h.hexdigest()


def fetch(url, timeout=60):
    request = urllib.request.Request(url, headers={"User-Agent": "fleet-build-swe-dataset"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def sdist(cache):
    """The pinned sdist, from the cache or PyPI; its sha256 checked either way."""
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, SDIST)
    if os.path.exists(path) and sha256_of(path) == SHA256:
        return path
    meta_url = f"{INDEX}/pypi/{PACKAGE}/json"
    try:
        meta = json.loads(fetch(meta_url))
        release = meta.get("releases", {}).get(VERSION, [])
        files = [f for f in release if f.get("filename") == SDIST]
        if not files:
            fail(f"{meta_url} lists no {SDIST}")
        url = urllib.parse.urljoin(meta_url, files[0]["url"])
        data = fetch(url, timeout=120)
    except (urllib.error.URLError, OSError, ValueError) as e:
        fail(
            f"cannot download {SDIST} from PyPI ({meta_url}): {e}. To build offline, put the "
            f"file (sha256 {SHA256}) at {path}"
        )
    got = hashlib.sha256(data).hexdigest()
    if got != SHA256:
        fail(f"{SDIST} from PyPI has sha256 {got}, not the pinned {SHA256}: refusing it")
    partial = path + ".part"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, path)
    return path


def extract(archive, into):
    """The sdist's files in `into` (its one top folder stripped); links and odd paths refused."""
    top = f"{PACKAGE}-{VERSION}/"
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name
            if name == top.rstrip("/") and member.isdir():
                continue
            if not name.startswith(top) or ".." in name.split("/") or name.startswith("/"):
                fail(f"{SDIST} holds an unexpected path `{name}`")
            if not (member.isfile() or member.isdir()):
                fail(f"{SDIST} holds `{name}`, which is not a plain file or folder")
            rel = name[len(top):]
            if not rel:
                continue
            dest = os.path.join(into, rel)
            if member.isdir():
                os.makedirs(dest, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with tar.extractfile(member) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            os.chmod(dest, 0o755 if member.mode & 0o111 else 0o644)


def git(work, *args):
    env = dict(os.environ)
    env.update(GIT_ENV)
    out = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false",
         "-c", "core.autocrlf=false", "-c", "diff.noprefix=false",
         "-c", "diff.mnemonicPrefix=false", "-c", "init.defaultBranch=main", *args],
        cwd=work, env=env, check=True, capture_output=True, text=True,
    )
    return out.stdout


def edit(work, rel, before, after):
    path = os.path.join(work, rel)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.count(before) != 1:
        fail(f"{rel}: expected exactly one `{before.strip()}` in the published source")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(before, after))


def append(work, rel, text, imports=None):
    path = os.path.join(work, rel)
    with open(path, encoding="utf-8") as f:
        body = f.read()
    if imports:
        first, rest = body.split("\n", 1)
        body = f"{first}\n{imports}{rest}"
    with open(path, "w", encoding="utf-8") as f:
        f.write(body + text)


def diff(work, *args):
    return git(work, "diff", "--no-color", "--no-ext-diff", "--no-renames", *args)


def collected(rel, source):
    """Node ids of the tests pytest collects from this file by default, read from its syntax
    tree: undecorated `test*` functions, and `test*` methods of undecorated `Test*` classes
    without `__init__` (their bases' methods included). Decorated tests (skips, marks,
    parametrizations) are left out: their outcome or ids are not knowable from here."""
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def methods(cls, depth=0):
        found = {}
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in classes and depth < 8:
                found.update(methods(classes[base.id], depth + 1))
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[node.name] = not node.decorator_list and node.name.startswith("test")
        return found

    ids = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            if not node.decorator_list:
                ids.append(f"{rel}::{node.name}")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            own = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            marked = any(
                isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__test__" for t in n.targets)
                for n in node.body
            )
            if node.decorator_list or "__init__" in own or marked:
                continue
            for name, kept in methods(node).items():
                if kept:
                    ids.append(f"{rel}::{node.name}::{name}")
    return ids


def script(diff_text, summary):
    return {"se": [{"output": {"unified_diff": diff_text, "summary": summary}}]}


def build(out, cache):
    archive = sdist(cache)
    os.makedirs(out, exist_ok=True)
    mirrors = os.path.join(out, "mirrors")
    mirror = os.path.join(mirrors, MIRROR)
    with tempfile.TemporaryDirectory(prefix="fleet-swe-") as tmp:
        work = os.path.join(tmp, "work")
        os.makedirs(work)
        extract(archive, work)
        git(work, "init", "-q")
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", f"{PACKAGE} {VERSION} as published on PyPI ({SDIST})")
        main = git(work, "rev-parse", "HEAD").strip()
        instances, scripted, expected = [], [], {}
        for bug in BUGS:
            instance_id = f"{MIRROR}-{bug['n']}"
            git(work, "checkout", "-q", "-B", f"bug/{bug['n']}", main)
            edit(work, bug["file"], bug["before"], bug["after"])
            git(work, "commit", "-q", "-am", bug["subject"])
            base = git(work, "rev-parse", "HEAD").strip()
            gold = diff(work, base, main, "--", bug["file"])
            with open(os.path.join(work, bug["test_file"]), encoding="utf-8") as f:
                existing = collected(bug["test_file"], f.read())
            append(work, bug["test_file"], bug["tests"], bug["imports"])
            test_patch = diff(work)
            git(work, "checkout", "-q", "--", ".")
            # A wrong patch: the buggy line explained, not fixed (the code as at the base, so
            # every FAIL_TO_PASS test fails and every PASS_TO_PASS test passes under it).
            indent = bug["after"][: len(bug["after"]) - len(bug["after"].lstrip(" "))]
            edit(work, bug["file"], bug["after"], f"{indent}# checked: as intended\n" + bug["after"])
            wrong = diff(work)
            git(work, "checkout", "-q", "--", ".")
            # Out of scope: the fix, plus a file the write scope does not name.
            edit(work, bug["file"], bug["after"], bug["before"])
            append(work, "README.rst", "\nFixed: see the changelog.\n")
            scope = diff(work)
            git(work, "checkout", "-q", "--", ".")
            # The fix, plus an edit to a file the test patch touches (never the agent's).
            edit(work, bug["file"], bug["after"], bug["before"])
            append(work, bug["test_file"], "\n\ndef test_added_by_the_agent():\n    assert True\n")
            testfile = diff(work)
            git(work, "checkout", "-q", "--", ".")
            if not (gold and test_patch and wrong and scope and testfile):
                fail(f"{instance_id}: an empty patch")
            f2p = [f"{bug['test_file']}::{t}" for t in bug["fail_to_pass"]]
            p2p = existing + [f"{bug['test_file']}::{t}" for t in bug["new_pass_to_pass"]]
            instance = {
                "instance_id": instance_id,
                "repo": REPO,
                "base_commit": base,
                "patch": gold,
                "test_patch": test_patch,
                "problem_statement": bug["problem"],
                "hints_text": "",
                "created_at": DATE,
                "version": VERSION,
                # As the published SWE-bench files give them: JSON lists encoded as strings.
                "FAIL_TO_PASS": json.dumps(f2p),
                "PASS_TO_PASS": json.dumps(p2p),
                "environment_setup_commit": main,
            }
            instances.append(instance)
            scripts = {
                "gold": script(gold, "the fix: " + bug["subject"] + ", undone"),
                "wrong": script(wrong, "a comment on the buggy line; nothing fixed"),
                "scope": script(scope, "the fix, and a line in README.rst"),
                "testfile": script(testfile, "the fix, and a test of my own in the test file"),
            }
            folder = os.path.join(out, "scripts", instance_id)
            os.makedirs(folder, exist_ok=True)
            for agent in AGENTS:
                with open(os.path.join(folder, f"{agent}.json"), "w", encoding="utf-8") as f:
                    json.dump(scripts[agent], f, indent=2)
                    f.write("\n")
                item = dict(instance, instance_id=f"{instance_id}.{agent}", script=scripts[agent])
                scripted.append(item)
                expected[item["instance_id"]] = dict(
                    EXPECTED[agent], fail_to_pass=f2p, pass_to_pass=p2p
                )
        git(work, "checkout", "-q", "main")
        fresh = os.path.join(tmp, "mirror.git")
        git(tmp, "clone", "-q", "--bare", work, fresh)
        git(fresh, "remote", "remove", "origin")
        os.makedirs(mirrors, exist_ok=True)
        shutil.rmtree(mirror, ignore_errors=True)
        shutil.move(fresh, mirror)
    write_jsonl(os.path.join(out, "dataset.jsonl"), instances)
    write_jsonl(os.path.join(out, "scripted.jsonl"), scripted)
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{len(instances)} instances of {REPO} (base {main[:12]}) in {out}")


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the folder to write the mirror and the dataset into")
    default_cache = os.environ.get("FLEET_SWE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "fleet-swe"
    )
    parser.add_argument("--cache", default=default_cache, help="where the sdist is kept")
    args = parser.parse_args()
    build(os.path.abspath(args.out), os.path.abspath(args.cache))


if __name__ == "__main__":
    main()

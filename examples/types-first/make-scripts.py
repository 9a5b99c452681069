#!/usr/bin/env python3
"""Writes the scripted agents of the types-first example (seed 003), one JSON file per story:

- script-happy.json: the test session writes its tests in two invocations; the impl session's
  first invocation does not build (the checkpoint's error goes into its second prompt), and the
  test session's crosstalk reaches it while it runs; the merged code fails one frozen test, and
  the impl session, continued with the failures (`fix`), mends it.
- script-stuck.json: the impl session commits nothing twice in a row: impl_stuck.
- script-green-tests.json: the test session writes tests that pass on the skeleton (a cheat):
  tests_pass_on_skeleton.
- script-haskell.json (with input-haskell.json): the happy story on seed 003's own example, the
  Haskell Data.Stack with QuickCheck properties, in fleet-agent-hs:1.

Run it from anywhere; it writes next to itself.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

TYPES = {
    "data_type_name": "Stack",
    "data_type": "A LIFO stack of arbitrary values.",
    "signatures": [
        {"name": "push", "type": "(self, item) -> None", "doc": "puts item on top"},
        {"name": "pop", "type": "(self)", "doc": "removes and returns the top; IndexError when empty"},
        {"name": "peek", "type": "(self)", "doc": "returns the top without removing it; IndexError when empty"},
        {"name": "size", "type": "(self) -> int", "doc": "the number of items"},
        {"name": "is_empty", "type": "(self) -> bool", "doc": "whether there is no item"},
    ],
    "test_priorities": [
        {"name": "lifo_order", "description": "push a, b, c; pop returns c, b, a", "rationale": None},
        {"name": "push_pop_inverse", "description": "pop after push returns the pushed item and restores the size"},
    ],
}

TESTS_DONE = '''"""Tests of stack."""

import pytest

from stack import Stack


def test_push():
    s = Stack()
    s.push(1)
    assert s.size() == 1 and s.peek() == 1


def test_pop():
    s = Stack()
    s.push(1)
    s.push(2)
    assert s.pop() == 2
    with pytest.raises(IndexError):
        Stack().pop()


def test_peek():
    s = Stack()
    s.push(1)
    s.push(2)
    assert s.peek() == 2 and s.size() == 2
    with pytest.raises(IndexError):
        Stack().peek()


def test_size():
    s = Stack()
    for i in range(3):
        s.push(i)
    assert s.size() == 3


def test_is_empty():
    s = Stack()
    assert s.is_empty()
    s.push(0)
    assert not s.is_empty()


def test_lifo_order():
    s = Stack()
    for x in "abc":
        s.push(x)
    assert [s.pop(), s.pop(), s.pop()] == ["c", "b", "a"]


def test_push_pop_inverse():
    s = Stack()
    s.push(7)
    s.push(8)
    assert s.pop() == 8 and s.size() == 1
'''

def first_increment(done):
    """The finished tests with every test after `test_pop` still failing with its spec."""
    head, rest = done.split("\n\ndef test_peek", 1)
    stubs = [
        ("peek", "returns the top without removing it; IndexError when empty"),
        ("size", "the number of items"),
        ("is_empty", "whether there is no item"),
        ("lifo_order", "push a, b, c; pop returns c, b, a"),
        ("push_pop_inverse", "pop after push returns the pushed item"),
    ]
    body = "".join(
        f'\n\ndef test_{name}():\n    raise AssertionError("SPEC[{name}]: {spec}")\n'
        for name, spec in stubs
    )
    return head.replace("Tests of stack.", "Tests of stack (first increment).") + body


TESTS_FIRST = first_increment(TESTS_DONE)


GREEN_TESTS = '''"""Tests that pass without an implementation (a cheat)."""


def test_push():
    assert True


def test_pop():
    assert 1 + 1 == 2
'''

IMPL_BROKEN = '''"""stack"""


class Stack:
    def __init__(self)
        self._items = []
'''

IMPL_BUGGY = '''"""stack"""


class Stack:
    """A LIFO stack of arbitrary values."""

    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise IndexError("pop from an empty stack")
        return self._items.pop()

    def peek(self):
        if not self._items:
            raise IndexError("peek at an empty stack")
        return self._items[0]

    def size(self):
        return len(self._items)

    def is_empty(self):
        return not self._items
'''

IMPL_FIXED = IMPL_BUGGY.replace("return self._items[0]", "return self._items[-1]")

ALL = ["push", "pop", "peek", "size", "is_empty"]
PROPS = ["test_" + n for n in ALL] + ["test_lifo_order", "test_push_pop_inverse"]


def progress(status, completed, remaining, notes=None):
    return {"status": status, "completed": completed, "remaining": remaining, "notes": notes}


def tests_session(first, then):
    return [
        {"files": {"tests/test_stack.py": first},
         "output": progress("more_work", ["test_push", "test_pop"], PROPS[2:])},
        {"files": {"tests/test_stack.py": then},
         "output": progress("done", PROPS[2:], [])},
    ]


def happy():
    return {
        "types": [{"output": TYPES}],
        "tests_loop": tests_session(TESTS_FIRST, TESTS_DONE),
        "impl_loop": [
            # Slow enough that the test session's first increment lands while it runs.
            {"delay_seconds": 8, "files": {"stack.py": IMPL_BROKEN},
             "output": progress("more_work", [], ALL)},
            {"files": {"stack.py": IMPL_BUGGY},
             "output": progress("done", ALL, [], "peek reads the top")},
        ],
        "fix": [{"files": {"stack.py": IMPL_FIXED}, "output": {"changes": ["peek returns the last item"]}}],
    }


def stuck():
    s = happy()
    s["impl_loop"] = [
        {"files": {"stack.py": IMPL_BUGGY}, "output": progress("more_work", ["push"], ["pop"])},
        {"output": progress("more_work", [], ["pop"])},
        {"output": progress("more_work", [], ["pop"])},
    ]
    return s


def green_tests():
    s = happy()
    s["tests_loop"] = [{"files": {"tests/test_stack.py": GREEN_TESTS},
                        "output": progress("done", ["test_push", "test_pop"], [])}]
    s["impl_loop"] = [{"files": {"stack.py": IMPL_FIXED}, "output": progress("done", ALL, [])}]
    return s


# The Haskell story (input-haskell.json, seed 003's own example): the same as happy(), on
# Data.Stack with QuickCheck properties in fleet-agent-hs:1.

TYPES_HS = {
    "data_type_name": "Stack",
    "data_type": "A stack of values, the most recently pushed on top.",
    "type_params": ["a"],
    "constructors": [{"name": "Empty", "fields": []}, {"name": "Push", "fields": ["a", "(Stack a)"]}],
    "deriving": ["Show", "Eq"],
    "signatures": [
        {"name": "empty", "type": "Stack a", "doc": "the stack with no value"},
        {"name": "push", "type": "a -> Stack a -> Stack a", "doc": "puts a value on top"},
        {"name": "pop", "type": "Stack a -> Maybe (a, Stack a)", "doc": "the top and the rest, Nothing when empty"},
        {"name": "peek", "type": "Stack a -> Maybe a", "doc": "the top, Nothing when empty"},
        {"name": "size", "type": "Stack a -> Int", "doc": "the number of values"},
        {"name": "isEmpty", "type": "Stack a -> Bool", "doc": "whether there is no value"},
    ],
    "test_priorities": [
        {"name": "lifo_order", "description": "pushing xs then popping all gives reverse xs", "rationale": None},
        {"name": "push_pop_inverse", "description": "pop after push gives the pushed value and the stack before"},
    ],
}

HS_HEAD = """-- | The properties of Data.Stack.
module Spec where

import Data.Stack
import Test.QuickCheck

fromList :: [a] -> Stack a
fromList = foldr push empty

drain :: Stack a -> [a]
drain s = case pop s of
  Nothing -> []
  Just (x, rest) -> x : drain rest
"""

HS_PROPS = [
    ("empty", "prop_empty :: Bool\nprop_empty = isEmpty (empty :: Stack Int) && size (empty :: Stack Int) == 0\n"),
    ("push", "prop_push :: Int -> [Int] -> Property\nprop_push x xs = size (push x (fromList xs)) === length xs + 1\n"),
    ("pop", "prop_pop :: Int -> [Int] -> Property\nprop_pop x xs = pop (push x (fromList xs)) === Just (x, fromList xs)\n"),
    ("peek", "prop_peek :: Int -> [Int] -> Property\nprop_peek x xs = peek (push x (fromList xs)) === Just x\n"),
    ("size", "prop_size :: [Int] -> Property\nprop_size xs = size (fromList xs) === length xs\n"),
    ("isEmpty", "prop_isEmpty :: [Int] -> Property\nprop_isEmpty xs = isEmpty (fromList xs) === null xs\n"),
    ("lifo_order", "prop_lifo_order :: [Int] -> Property\nprop_lifo_order xs = drain (foldl (flip push) empty xs) === reverse xs\n"),
    ("push_pop_inverse", "prop_push_pop_inverse :: Int -> [Int] -> Property\n"
     "prop_push_pop_inverse x xs = fmap snd (pop (push x s)) === Just s\n  where\n    s = fromList xs\n"),
]
HS_NAMES = ["prop_" + n for n, _ in HS_PROPS]


def hs_tests(written):
    """The test module with the first `written` properties written, the rest still stubs."""
    body = []
    for i, (name, prop) in enumerate(HS_PROPS):
        if i < written:
            body.append(prop)
        else:
            body.append(f'prop_{name} :: Property\nprop_{name} = error "SPEC[{name}]: not written yet"\n')
    return HS_HEAD + "\n" + "\n".join(body)


HS_IMPL = """-- | Data.Stack (types-first).
module Data.Stack
  ( Stack(..)
  , empty
  , push
  , pop
  , peek
  , size
  , isEmpty
  ) where

-- | A stack of values, the most recently pushed on top.
data Stack a
  = Empty
  | Push a (Stack a)
  deriving (Show, Eq)

empty :: Stack a
empty = Empty

push :: a -> Stack a -> Stack a
push = Push

pop :: Stack a -> Maybe (a, Stack a)
pop Empty = Nothing
pop (Push x s) = Just (x, s)

peek :: Stack a -> Maybe a
peek = fmap fst . pop

size :: Stack a -> Int
size Empty = 0
size (Push _ s) = 1 + size s

isEmpty :: Stack a -> Bool
isEmpty s = size s == 0
"""

# A type error: the checkpoint's build fails, and ghc's message goes into the next prompt.
HS_IMPL_BROKEN = HS_IMPL.replace("push = Push\n", "push x = Push x x\n")
# peek reads the bottom of the stack: prop_peek fails on the merged code.
HS_IMPL_BUGGY = HS_IMPL.replace(
    "peek = fmap fst . pop\n",
    "peek Empty = Nothing\npeek (Push x Empty) = Just x\npeek (Push _ s) = peek s\n",
)
HS_ALL = [s["name"] for s in TYPES_HS["signatures"]]


def haskell():
    return {
        "types": [{"output": TYPES_HS}],
        "tests_loop": [
            {"files": {"test/Spec.hs": hs_tests(3)},
             "output": progress("more_work", HS_NAMES[:3], HS_NAMES[3:])},
            {"files": {"test/Spec.hs": hs_tests(len(HS_PROPS))},
             "output": progress("done", HS_NAMES[3:], [])},
        ],
        "impl_loop": [
            {"delay_seconds": 8, "files": {"src/Data/Stack.hs": HS_IMPL_BROKEN},
             "output": progress("more_work", ["empty"], HS_ALL[1:])},
            {"files": {"src/Data/Stack.hs": HS_IMPL_BUGGY},
             "output": progress("done", HS_ALL, [], "peek walks the stack")},
        ],
        "fix": [{"files": {"src/Data/Stack.hs": HS_IMPL}, "output": {"changes": ["peek reads the top"]}}],
    }


for name, script in [("happy", happy()), ("stuck", stuck()), ("green-tests", green_tests()),
                     ("haskell", haskell())]:
    with open(os.path.join(HERE, f"script-{name}.json"), "w") as f:
        json.dump(script, f, indent=1)
        f.write("\n")

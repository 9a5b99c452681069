#!/usr/bin/env python3
"""Writes the scripted agents of the hardened-coder example (seed 004), script-story.json:

- the initializer writes feature_list.json (four features; it marks the fourth passing, which
  the review sets back, and the fourth has too few steps, which the review warns about),
  init.sh and the app;
- session 1 builds the page with a bug in adding, claims features 1 and 2, and cheats: it
  rewrites the steps of feature 3 and deletes feature 4 (both refused and reverted);
- the harness starts the app (init.sh) in each verifier's container; the verifiers have the
  browser only, and each step of a feature is answered with its own screenshot;
- the first verifier of 1 lies: it passes the 4-step feature with one invented step and no
  screenshot; the harness voids its answer, the second verifier passes it: the votes disagree,
  1 goes to quarantine; the verifier refutes 2 twice: 2 is set back to passes: false, with the
  reason for the next session;
- session 2 reads the list on disk, fixes adding and claims 2, 3 and 4 (1 waits in quarantine); the verifier confirms
  2 (it types 'milk', clicks Add, reads the list) and 3; on 4 it fails once, then passes: the
  votes disagree, 4 goes to quarantine.

Run it from anywhere; it writes next to itself.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

FEATURES = [
    {"id": 1, "category": "functional", "description": "The page shows the heading 'To-do'",
     "steps": ["Step 1: Navigate to http://127.0.0.1:8765/",
               "Step 2: Verify the page title is 'To-do'",
               "Step 3: Verify an h1 element contains exactly 'To-do'",
               "Step 4: Verify the text field with id 'item' is empty"],
     "passes": False},
    {"id": 2, "category": "functional", "description": "Adding an item shows it in the list",
     "steps": ["Step 1: Navigate to http://127.0.0.1:8765/",
               "Step 2: Type 'milk' into the field with id 'item'",
               "Step 3: Click the button 'Add'",
               "Step 4: Verify the list with id 'items' has one entry 'milk'",
               "Step 5: Verify the field with id 'item' is empty again"],
     "passes": False},
    {"id": 3, "category": "edge-case", "description": "Adding an empty item shows an error",
     "steps": ["Step 1: Navigate to http://127.0.0.1:8765/",
               "Step 2: Click the button 'Add' with the field empty",
               "Step 3: Verify the element with id 'error' shows 'Item is empty'",
               "Step 4: Verify the list with id 'items' has no entry"],
     "passes": False},
    {"id": 4, "category": "style", "description": "The list shows its count",
     "steps": ["Step 1: Add 'a' and 'b'",
               "Step 2: Verify the element with id 'count' shows '2 items'"],
     "passes": True},
]


def feature_list(features):
    return json.dumps(features, indent=2) + "\n"


SERVER = '''"""Serves the to-do page on 127.0.0.1:8765 (python3 app/server.py)."""
import functools
import http.server
import pathlib

ROOT = str(pathlib.Path(__file__).parent)
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=ROOT)
http.server.ThreadingHTTPServer(("127.0.0.1", 8765), handler).serve_forever()
'''

INIT = '''#!/bin/sh
# Starts the to-do page in the background and prints its URL.
python3 app/server.py >/tmp/todo.log 2>&1 &
for _ in $(seq 50); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/')" 2>/dev/null && break
  sleep 0.1
done
echo http://127.0.0.1:8765/
'''

PAGE = '''<!doctype html>
<html>
<head><meta charset="utf-8"><title>To-do</title></head>
<body>
<h1>To-do</h1>
<input id="item" value=""><button id="add">Add</button>
<p id="error"></p>
<ul id="items"></ul>
<p id="count">0 items</p>
<script>
document.getElementById('add').onclick = function () {
  var field = document.getElementById('item');
  var error = document.getElementById('error');
  if (!field.value) { error.textContent = 'Item is empty'; return; }
  error.textContent = '';
  var li = document.createElement('li');
  li.textContent = field.value;
  document.getElementById('items').appendChild(li);
  field.value = '';
  document.getElementById('count').textContent =
    document.getElementById('items').children.length + ' items';
};
</script>
</body>
</html>
'''

# Session 1's bug: the new entry goes into the error paragraph, not the list.
PAGE_BUGGY = PAGE.replace("document.getElementById('items').appendChild(li);",
                          "document.getElementById('error').appendChild(li);")


def claimed(features, ids):
    out = json.loads(json.dumps(features))
    for f in out:
        f["passes"] = f["id"] in ids
    return out


def session_one_list():
    out = claimed(FEATURES, [1, 2])
    out[2]["steps"] = ["Step 1: it works"]   # cheat: steps rewritten
    del out[3]                               # cheat: a feature deleted
    return out


URL = "http://127.0.0.1:8765/"

# What a user does for each step of a feature, in the browser (the first step is the page
# opening at the URL); every step is followed by its screenshot, `f<id>_step<n>`.
ACTIONS = {
    1: [[], [{"text": "title"}], [{"text": "h1"}], [{"text": "#item"}]],
    2: [[], [{"type": {"selector": "#item", "text": "milk"}}], [{"click": "#add"}],
        [{"text": "#items"}], [{"text": "#item"}]],
    3: [[], [{"click": "#add"}], [{"text": "#error"}], [{"text": "#items"}]],
    4: [[{"type": {"selector": "#item", "text": "a"}}, {"click": "#add"},
         {"type": {"selector": "#item", "text": "b"}}, {"click": "#add"}],
        [{"text": "#count"}]],
}


def browse(feature):
    """One browser call doing the feature's steps, a screenshot after each."""
    actions = []
    for n, step in enumerate(ACTIONS[feature], 1):
        actions += step + [{"screenshot": f"f{feature}_step{n}"}]
    return {"name": "browser", "input": {"url": URL, "actions": actions}}


def verification(feature, passes, reason, failed_at=None):
    """The seed's answer: the feature's steps one to one, each with its screenshot (a failing
    answer stops at the step that failed)."""
    steps = FEATURES[feature - 1]["steps"]
    if failed_at is not None:
        steps = steps[:failed_at]
    return {
        "test_passes": passes,
        "steps": [{"step_number": i, "step_text": text,
                   "result": "fail" if i == failed_at else "pass",
                   "screenshot": f"f{feature}_step{i}",
                   "observation": reason, "reasoning": reason}
                  for i, text in enumerate(steps, 1)],
        "overall_reasoning": reason,
        "failure_reason": None if passes else reason,
    }


def verifier(feature, rnd, passes, reason, failed_at=None):
    return {"when": {"feature_id": feature, "round": rnd},
            "tool_calls": [browse(feature)],
            "output": verification(feature, passes, reason, failed_at)}


def lying_verifier(feature, rnd):
    """Passes the feature on its word: one invented step, no browser, no screenshot."""
    return {"when": {"feature_id": feature, "round": rnd},
            "output": {"test_passes": True,
                       "steps": [{"step_number": 1, "step_text": "step 1", "result": "pass",
                                  "screenshot": None, "observation": "looks right",
                                  "reasoning": "looks right"}],
                       "overall_reasoning": "looks right", "failure_reason": None}}


def story():
    return {
        "initializer": [{
            "files": {"feature_list.json": feature_list(FEATURES), "init.sh": INIT,
                      "app/server.py": SERVER, "app/index.html": PAGE_BUGGY},
            "output": {"summary": "four features, init.sh, the app skeleton"},
        }],
        "coder": [
            {"files": {"app/index.html": PAGE_BUGGY,
                       "feature_list.json": feature_list(session_one_list())},
             "output": {"summary": "heading and adding done", "claimed": [1, 2, 3, 4]}},
            {"commands": ["cat feature_list.json"],
             "files": {"app/index.html": PAGE,
                       "feature_list.json": feature_list(claimed(FEATURES, [2, 3, 4]))},
             "output": {"summary": "adding fixed; error and count done", "claimed": [2, 3, 4]}},
        ],
        "verify": [
            lying_verifier(1, 1),
            verifier(2, 1, False, "after Add, the list with id 'items' has no entry", 4),
            verifier(2, 2, True, "milk is in the list"),
            verifier(3, 2, True, "the error reads Item is empty"),
            verifier(4, 2, False, "the count was not visible in time", 2),
        ],
        "verify_again": [
            verifier(1, 1, True, "the heading reads To-do"),
            verifier(2, 1, False, "again: 'milk' went into the error paragraph", 4),
            verifier(4, 2, True, "the count reads 2 items"),
        ],
    }


with open(os.path.join(HERE, "script-story.json"), "w") as f:
    json.dump(story(), f, indent=1)
    f.write("\n")

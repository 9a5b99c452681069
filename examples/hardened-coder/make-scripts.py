#!/usr/bin/env python3
"""Writes the scripted agents of the hardened-coder example (seed 004), script-story.json:

- the initializer writes feature_list.json (four features; it marks the fourth passing, which
  the review sets back, and the fourth has too few steps, which the review warns about),
  init.sh and the app;
- session 1 builds the page with a bug in adding, claims features 1 and 2, and cheats: it
  rewrites the steps of feature 3 and deletes feature 4 (both refused and reverted);
- the verifier confirms 1 (after starting the app from its own checkout and fetching the page)
  and refutes 2 twice: 2 is set back to passes: false, with the reason for the next session;
- session 2 reads the list on disk, fixes adding and claims 2, 3 and 4; the verifier confirms
  2 (in a browser: it types 'milk', clicks Add, reads the list and keeps a screenshot) and 3; on 4 it fails once, then passes: the votes disagree, 4 goes to quarantine.

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


def verification(passes, reason, steps=1, shot=None):
    # `shot`: the screenshot the steps cite, one the verifier must have taken (the graph's
    # `evidence:` check).
    return {
        "test_passes": passes,
        "steps": [{"step_number": i, "step_text": f"step {i}",
                   "result": "pass" if passes else "fail", "screenshot": shot,
                   "observation": reason, "reasoning": reason}
                  for i in range(1, steps + 1)],
        "overall_reasoning": reason,
        "failure_reason": None if passes else reason,
    }


FETCH = ("python3 -c \"import urllib.request; "
         "print(urllib.request.urlopen('http://127.0.0.1:8765/').read().decode()[:120])\"")


def story():
    def verifier(feature, rnd, passes, reason, commands=(), shot=None):
        return {"when": {"feature_id": feature, "round": rnd}, "commands": list(commands),
                "output": verification(passes, reason, shot=shot)}

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
                       "feature_list.json": feature_list(claimed(FEATURES, [1, 2, 3, 4]))},
             "output": {"summary": "adding fixed; error and count done", "claimed": [2, 3, 4]}},
        ],
        "verify": [
            verifier(1, 1, True, "the heading reads To-do", ["sh init.sh", FETCH]),
            verifier(2, 1, False, "after Add, the list with id 'items' has no entry"),
            dict(verifier(2, 2, True, "milk is in the list", shot="after_add"),
                 commands=["sh init.sh"],
                 tool_calls=[{"name": "browser", "input": {
                     "url": "http://127.0.0.1:8765/",
                     "actions": [{"type": {"selector": "#item", "text": "milk"}},
                                 {"click": "#add"}, {"text": "#items"}, {"text": "#count"},
                                 {"screenshot": "after_add"}]}}]),
            verifier(3, 2, True, "the error reads Item is empty"),
            verifier(4, 2, False, "the count was not visible in time"),
        ],
        "verify_again": [
            verifier(2, 1, False, "again: 'milk' went into the error paragraph"),
            verifier(4, 2, True, "the count reads 2 items"),
        ],
    }


with open(os.path.join(HERE, "script-story.json"), "w") as f:
    json.dump(story(), f, indent=1)
    f.write("\n")

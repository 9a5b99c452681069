#!/usr/bin/env python3
"""Writes the scripted agents of the v3-tree example (script-*.json) and its input.json.

Run from examples/v3-tree: python3 make-scripts.py. Each script plays every module of the
tree through `when: {module: ...}` (and the parent judge through `child`, `child_status`)."""
import json
spec=lambda i,d,c: {"id":i,"description":d,"acceptance_criteria":c,"target_path":f"{i}.py","test_path":f"tests/test_{i}.py"}
incr=spec("incr","incr(x) returns x + 1",["incr(1) == 2","incr(-1) == 0"])
adder=spec("adder","add(a, b) adds two integers, built on incr",["add(2, 3) == 5","add(0, 0) == 0"])
mult=spec("multiplier","mul(a, b) multiplies two integers",["mul(2, 3) == 6","mul(0, 5) == 0"])
calc=spec("calc","calc(op, a, b) applies '+' or '*' through the add and mul modules",["calc('+', 2, 3) == 5","calc('*', 2, 3) == 6"])
json.dump({"spec":calc},open("input.json","w"),indent=2)
open("input.json","a").write("\n")
children={"calc":[adder,mult],"adder":[incr],"multiplier":[],"incr":[]}
skel={"calc":"def calc(op, a, b):\n    raise NotImplementedError\n",
      "adder":"def add(a, b):\n    raise NotImplementedError\n",
      "multiplier":"def mul(a, b):\n    raise NotImplementedError\n",
      "incr":"def incr(x):\n    raise NotImplementedError\n"}
impl={"calc":"from adder import add\nfrom multiplier import mul\n\n\ndef calc(op, a, b):\n    return {'+': add, '*': mul}[op](a, b)\n",
      "adder":"from incr import incr\n\n\ndef add(a, b):\n    for _ in range(b):\n        a = incr(a)\n    return a\n",
      "multiplier":"def mul(a, b):\n    return a * b\n",
      "incr":"def incr(x):\n    return x + 1\n"}
tests={"calc":"from calc import calc\n\n\ndef test_add():\n    assert calc('+', 2, 3) == 5\n\n\ndef test_mul():\n    assert calc('*', 2, 3) == 6\n",
       "adder":"from adder import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n",
       "multiplier":"from multiplier import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n\n\ndef test_zero():\n    assert mul(0, 5) == 0\n",
       "incr":"from incr import incr\n\n\ndef test_one():\n    assert incr(1) == 2\n\n\ndef test_negative():\n    assert incr(-1) == 0\n"}
def script(judge_of=None, impl_of=None):
    s={"scaffold":[],"tests":[],"judge":[],"impl":[],"review":[]}
    for m in ["calc","adder","multiplier","incr"]:
        w={"module":m}
        s["scaffold"].append({"when":w,"files":{f"{m}.py":skel[m]},"output":{"init_work":{"interface_file":f"{m}.py","test_plan":["one test per criterion"],"child_specs":children[m]}}})
        s["tests"].append({"when":w,"files":{f"tests/test_{m}.py":tests[m]},"output":{"test_files":[f"tests/test_{m}.py"],"pending_criteria":["all"]}})
        steps=(impl_of or {}).get(m) or [{"files":{f"{m}.py":impl[m]},"output":{"decision":"tests_passed"}}]
        for st in steps:
            s["impl"].append(dict(st, when=w))
        s["review"].append({"when":w,"output":{"decision":"approved"}})
    for parent,kids in children.items():
        for k in kids:
            v=(judge_of or {}).get(k["id"],{"verdict":"approve","reason":"meets its criteria"})
            s["judge"].append({"when":{"module":parent,"child":k["id"]},"output":v})
    return s
def dump(name,s):
    json.dump(s,open(name,"w"),indent=1); open(name,"a").write("\n")
dump("script-happy.json",script())
retry=[{"output":{"decision":"request_retry","strategy":f"attempt {i}"}} for i in range(1,6)]
# The parent's judge approves the stuck child anyway: the harness does not take it.
dump("script-stuck.json",script(judge_of={"multiplier":{"verdict":"approve","reason":"looks done to me"}},impl_of={"multiplier":retry}))
# `multiplier`'s first claim is false, its skeleton untouched (the harness's run fails: its
# next attempt is shown the failures); its second passes its own tests but special-cases 0, which the review critiques
# (the next attempt is shown the critique); the parent rejects the child.
wrong=[{"output":{"decision":"tests_passed"}},
       {"files":{"multiplier.py":"def mul(a, b):\n    return a * b if a else 0\n"},"output":{"decision":"tests_passed"}},
       {"output":{"decision":"tests_passed"}}]
def rejected_script():
    s=script(judge_of={"multiplier":{"verdict":"reject","reason":"mul(0, 5) is special-cased rather than computed","unmet_criteria":["mul(0, 5) == 0"]}},impl_of={"multiplier":wrong})
    at=next(i for i,r in enumerate(s["review"]) if r["when"]["module"]=="multiplier")
    s["review"].insert(at,{"when":{"module":"multiplier"},"output":{"decision":"more_tests","feedback":"mul special-cases a == 0: compute it"}})
    return s
dump("script-rejected.json",rejected_script())
# Both children implement the same file `ops.py` differently: whichever merges second conflicts
# when it rebases onto the first's MergeComplete, fails with `rebase_conflict`, and the parent
# (judging a failed child) routes back to its Scaffold to re-plan, at most once.
def conflict_script():
    s=script()
    a=dict(adder, target_path="ops.py"); m=dict(mult, target_path="ops.py")
    for step in s["scaffold"]:
        mod=step["when"]["module"]
        if mod=="calc":
            step["output"]["init_work"]["child_specs"]=[a,m]
        if mod in ("adder","multiplier"):
            step["files"]={"ops.py":skel[mod]}
            step["output"]["init_work"]["interface_file"]="ops.py"
    for step in s["impl"]:
        mod=step["when"]["module"]
        if mod in ("adder","multiplier"):
            step["files"]={"ops.py":impl[mod]}
    for step in s["tests"]:
        mod=step["when"]["module"]
        if mod in ("adder","multiplier"):
            step["files"]={f"tests/test_{mod}.py":tests[mod].replace(f"from {mod} import","from ops import")}
    s["judge"]=[j for j in s["judge"] if j["when"]["module"]!="calc"]
    for k in ("adder","multiplier"):
        s["judge"].append({"when":{"module":"calc","child":k,"child_status":"succeeded"},"output":{"verdict":"approve","reason":"merged"}})
        s["judge"].append({"when":{"module":"calc","child":k,"child_status":"failed"},"output":{"verdict":"replan","reason":"the siblings collide in ops.py"}})
    return s
dump("script-conflict.json",conflict_script())
# `multiplier` renames the interface its parent planned (`times`) to `mul`; `adder`, whose
# skeleton imports `times`, is still waiting for its own child (slowed down) when `multiplier`
# merges: its rebase is clean, but it no longer imports, so its Rebaser adapts the import,
# mechanically (the same rename), and goes on.
def adapted_script():
    s=script()
    times="def times(a, b):\n    raise NotImplementedError\n"
    for step in s["scaffold"]:
        mod=step["when"]["module"]
        if mod=="calc":
            step["files"]["multiplier.py"]=times
        if mod=="adder":
            step["files"]["adder.py"]="from multiplier import times\n\n\ndef add(a, b):\n    raise NotImplementedError\n"
        if mod=="incr":
            step["delay_seconds"]=12
    s["adapt"]=[{"when":{"module":"adder"},"files":{"adder.py":"from multiplier import mul\n\n\ndef add(a, b):\n    raise NotImplementedError\n"},"output":{"summary":"times -> mul"}}]
    return s
dump("script-adapted.json",adapted_script())

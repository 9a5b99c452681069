# written by the fleet harness: the spec's checks run outside the test runner, in a plain
# interpreter under the same guard (written above this text with `_SOLO`). Code that behaves
# one way under pytest and another here is caught by the two results disagreeing.


def _solo_main(_solo=_SOLO):
    import json
    import sys
    with open(_solo["checks"], encoding="utf-8") as f:
        spec = json.load(f)
    sys.path.insert(0, _solo["work"])
    results = []
    for c in spec["checks"]:
        ns = {"__name__": "fleet_spec"}
        try:
            code = compile(spec["setup"] + "\n" + c["check"], "<fleet spec " + c["name"] + ">", "exec")
            exec(code, ns)
            if c["kind"] == "property":
                import fleet_gen
                fleet_gen.check(ns["prop"], spec["seed"], spec["cases"], spec["literals"])
            results.append({"function": c["function"], "ok": True, "message": ""})
        except BaseException as e:  # noqa: BLE001 - every failure of a check is its result
            results.append({"function": c["function"], "ok": False,
                            "message": (type(e).__name__ + ": " + str(e))[:500]})
    with open(_solo["results"], "w", encoding="utf-8") as f:
        json.dump({"nonce": spec["nonce"], "results": results}, f)
    _w = _os.write
    _w(_FD, ("end " + _CONF["nonce"] + "\n").encode())


_solo_main()

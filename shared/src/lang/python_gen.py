# written by the fleet harness: the spec's properties checked over inputs the agents never
# saw. `check(prop, seed, cases, literals)` calls `prop` with arguments drawn from its
# annotations (int, float, bool, str, bytes, list[...], tuple[...], dict[...], set[...],
# Optional[...]); edge values first, then values mixing fresh random ones with the literals
# the tests and the spec's examples use (so code that special-cases a visible input meets it
# beside its neighbours). The seed changes every run; a failure names its arguments.
import random as _random
import typing as _typing

_INT_EDGES = (0, 1, -1, 2, -2, 7, 10, 100, -100, 2**31 - 1, -(2**31))
_STR_EDGES = ("", "a", "ab", " ", "Z", "hello world", "\u00e9", "0")


def _ints(literals):
    return [v for v in literals if isinstance(v, int) and not isinstance(v, bool)]


def _strs(literals):
    return [v for v in literals if isinstance(v, str)]


def _draw(ann, rng, literals, depth=0):
    origin = _typing.get_origin(ann)
    args = _typing.get_args(ann)
    if ann is int:
        pool = _ints(literals)
        roll = rng.random()
        if pool and roll < 0.3:
            return rng.choice(pool) + rng.choice((0, 0, 1, -1))
        if roll < 0.45:
            return rng.choice(_INT_EDGES)
        return rng.randint(-1000, 1000)
    if ann is float:
        return rng.choice((0.0, 1.0, -1.0, 0.5)) if rng.random() < 0.2 else rng.uniform(-1e3, 1e3)
    if ann is bool:
        return rng.random() < 0.5
    if ann is str:
        pool = _strs(literals)
        roll = rng.random()
        if pool and roll < 0.3:
            return rng.choice(pool)
        if roll < 0.45:
            return rng.choice(_STR_EDGES)
        alphabet = "abcdefghijklmnopqrstuvwxyzABC 0123456789-_\u00e9"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
    if ann is bytes:
        return bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 12)))
    if depth > 3:
        raise TypeError("annotation nested too deeply: " + repr(ann))
    if origin in (list, _typing.List) or ann is list:
        inner = args[0] if args else int
        return [_draw(inner, rng, literals, depth + 1) for _ in range(rng.randint(0, 8))]
    if origin in (set, frozenset):
        inner = args[0] if args else int
        return origin(_draw(inner, rng, literals, depth + 1) for _ in range(rng.randint(0, 8)))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_draw(args[0], rng, literals, depth + 1) for _ in range(rng.randint(0, 6)))
        return tuple(_draw(a, rng, literals, depth + 1) for a in args)
    if origin is dict:
        k, v = args if args else (str, int)
        return {_draw(k, rng, literals, depth + 1): _draw(v, rng, literals, depth + 1)
                for _ in range(rng.randint(0, 6))}
    if origin is _typing.Union:
        return _draw(rng.choice(args), rng, literals, depth + 1)
    raise TypeError("no generator for the annotation " + repr(ann))


# Combinations of visible values tried before the random draws, at most this many.
_MAX_COMBOS = 400


def _visible(ann, literals):
    """The visible values (and their neighbours) a parameter may take, or None."""
    if ann is int:
        out = []
        for v in _ints(literals):
            for w in (v - 1, v, v + 1):
                if w not in out:
                    out.append(w)
        return out or None
    if ann is str:
        return list(dict.fromkeys(_strs(literals))) or None
    return None


def _combos(params, literals):
    pools = [_visible(p.annotation, literals) for p in params]
    if not params or any(p is None for p in pools):
        return []
    total = 1
    for p in pools:
        total *= len(p)
    if total > _MAX_COMBOS:
        return []
    out = [[]]
    for pool in pools:
        out = [c + [v] for c in out for v in pool]
    return out


def _draw_all(params, rng, literals):
    return [_draw(p.annotation, rng, literals) for p in params]


def check(prop, seed, cases=100, literals=()):
    import inspect
    rng = _random.Random(seed)
    params = list(inspect.signature(prop).parameters.values())
    for p in params:
        if p.annotation is inspect.Parameter.empty:
            raise TypeError("the property's parameter `" + p.name + "` has no annotation")
    drawn = (_draw_all(params, rng, literals) for _ in range(cases))
    for case, args in enumerate(list(_combos(params, literals)) + list(drawn)):
        try:
            result = prop(*args)
        except AssertionError as e:
            raise AssertionError("property falsified (case " + str(case) + ", seed "
                                 + str(seed) + ") by " + repr(tuple(args)) + ": " + str(e))
        if result is False:
            raise AssertionError("property falsified (case " + str(case) + ", seed "
                                 + str(seed) + ") by " + repr(tuple(args)))

"""Procedurally generated Python repositories: bug-fix tasks a policy cannot memorise.

The shipped repositories have one correct line per helper, so a model that has seen one bug of a
helper can fix its sibling bug by recalling the line. A generated repository draws every helper
from an operation grammar and every surface detail from a seed:

* **operations** (:data:`OPERATIONS`): arithmetic, comparisons with branches, string operations,
  list operations, loops, early returns, and compositions of other helpers; each has several forms
  with random operators, intermediate variables and argument orders;
* **names** from a *vocabulary* (:data:`VOCABULARIES`): helper, argument and variable names are
  verbs and nouns of one theme (``fold_hinge(bolt, valve)``), so a helper's name says nothing about
  its body; or, with the vocabulary ``coined`` (:data:`COINED`), nouns coined for each repository from
  syllables (``fold_kovel(zantri, pelmu)``), so no name recurs across repositories and a policy can
  only get one right by copying it from what it has read;
* **constants** from a *range* (:data:`CONSTANT_RANGES`);
* **layout**, the *style* (:data:`STYLES`): a package of modules, one module, a ``src/`` layout, or
  helpers as static methods of classes.

Each helper has its own test function whose expected values come from running the generated code
on random inputs, so a bug in one helper fails its test (and those of helpers that call it) while
the others keep passing: what :mod:`orchard.tasks.swe.generate` needs to keep a bug. Constants and
names make gold lines distinct across tasks (the task set drops any task whose gold line another
task already has, :func:`orchard.tasks.swe.skills.split_by_skill`).

:func:`write_repository` writes one repository and returns :class:`GeneratedRepo`, whose
:meth:`~GeneratedRepo.source` is a :class:`~orchard.tasks.swe.sources.RepoSource` that tags every
function with its operation; the task set's skill splits hold out operation/bug-kind combinations,
constant ranges, vocabularies and styles (:mod:`orchard.tasks.swe.skills`).
"""

from __future__ import annotations

import builtins
import keyword
import os
import random
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard.seeds import seeded_random
from orchard.tasks.swe.sources import RepoSource

OPERATIONS = ("arith", "compare", "string", "list", "loop", "early_return", "compose")
STYLES = ("modules", "single", "src", "classes")
VERBS = ("tally", "blend", "shift", "weigh", "fold", "scan", "trim", "merge", "score", "pack", "sift", "mark",
         "span", "rank", "mend", "stack", "sort", "tune", "grade", "clip")
VOCABULARIES: dict[str, tuple[str, ...]] = {
    "garden": ("river", "stone", "leaf", "moss", "fern", "petal", "root", "seed", "bark", "thorn", "pond", "reed",
               "clover", "ivy", "acorn", "willow", "meadow", "pollen"),
    "workshop": ("gear", "bolt", "lathe", "rivet", "anvil", "chisel", "clamp", "spring", "valve", "piston", "hinge",
                 "socket", "wrench", "ratchet", "spindle", "flange", "gasket", "pulley"),
    "kitchen": ("pan", "salt", "ladle", "crust", "broth", "whisk", "spice", "kettle", "dough", "pepper", "grater",
                "skillet", "saucer", "batter", "herb", "sieve", "oven", "butter"),
    "harbor": ("anchor", "buoy", "hull", "mast", "keel", "rudder", "deck", "cargo", "pier", "tide", "sail", "rope",
               "cabin", "dock", "ferry", "lantern", "beacon", "galley"),
    "sky": ("orbit", "comet", "nova", "quasar", "nebula", "pulsar", "lunar", "zenith", "meteor", "aurora", "eclipse",
            "galaxy", "photon", "solstice", "cosmos", "vega", "corona", "equinox"),
}
# A vocabulary of its own per repository: nouns coined from these syllables, two or three each.
COINED = "coined"
SYLLABLES = ("ba", "ko", "ri", "ta", "mu", "ve", "lo", "zan", "pel", "dri", "sko", "fen", "gor", "tal", "mi", "qua",
             "nok", "sel", "tur", "vik", "pra", "dun", "hes", "jo", "wim", "cal", "ner", "obo", "ust", "yel")
VOCABULARY_NAMES = (*VOCABULARIES, COINED)
_RESERVED = frozenset(keyword.kwlist) | frozenset(dir(builtins))  # no coined noun shadows these
CONSTANT_RANGES: dict[str, tuple[int, int]] = {"small": (2, 9), "large": (11, 29)}


def vocabulary_nouns(vocabulary: str, rng: random.Random, count: int = 18) -> tuple[str, ...]:
    """The nouns a repository's names are made of: a themed vocabulary's, or ``count`` coined ones."""
    if vocabulary != COINED:
        return VOCABULARIES[vocabulary]
    coined: set[str] = set()
    while len(coined) < count:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))
        if word not in _RESERVED:
            coined.add(word)
    return tuple(sorted(coined))


def renaming(nouns: Sequence[str], rng: random.Random, avoid: Iterable[str] = ()) -> dict[str, str]:
    """A fresh coined noun for each of ``nouns`` (none of them, nor of ``avoid``): one way to rename a repository."""
    taken = set(nouns) | set(avoid)
    fresh: list[str] = []
    while len(fresh) < len(nouns):
        word = vocabulary_nouns(COINED, rng, count=1)[0]
        if word not in taken:
            taken.add(word)
            fresh.append(word)
    return dict(zip(nouns, fresh, strict=True))


@dataclass(frozen=True)
class RepoSpec:
    """What one generated repository is drawn from."""

    name: str  # the package name, also the source's name in instance ids
    style: str = "modules"
    vocabulary: str = "garden"
    constants: str = "small"
    helpers: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"unknown style {self.style!r}; styles: {', '.join(STYLES)}")
        if self.vocabulary not in VOCABULARY_NAMES:
            raise ValueError(f"unknown vocabulary {self.vocabulary!r}; vocabularies: {', '.join(VOCABULARY_NAMES)}")
        if self.constants not in CONSTANT_RANGES:
            raise ValueError(f"unknown constant range {self.constants!r}; ranges: {', '.join(CONSTANT_RANGES)}")
        if not self.name.isidentifier():
            raise ValueError(f"a repository name is a Python identifier, got {self.name!r}")
        if self.helpers < 2:
            raise ValueError(f"a repository needs at least 2 helpers, got {self.helpers}")


@dataclass
class Helper:
    """One generated function: its name, typed parameters, body lines and operation."""

    name: str
    params: list[tuple[str, str]]  # (name, type: "int", "str" or "list") in the order of the signature
    body: list[str]  # without indentation
    operation: str
    doc: str
    module: str = ""
    returns_int: bool = False
    cases: list[tuple[tuple, Any]] = field(default_factory=list)  # (arguments, expected result) its test asserts


@dataclass(frozen=True)
class GeneratedRepo:
    spec: RepoSpec
    root: str
    functions: dict[str, str]  # "path:function" -> operation
    test_dirs: tuple[str, ...] = ("tests",)

    def source(self, **tags: str) -> RepoSource:
        """The repository as a bug source; instances from it carry its style, vocabulary, constant range,
        ``tags`` and each buggy function's operation in their metadata."""
        entries = {name: os.path.join(self.root, name) for name in sorted(os.listdir(self.root))}
        spec = self.spec
        return RepoSource(name=spec.name, repo=f"procedural/{spec.name}", version="0", entries=entries,
                          test_dirs=self.test_dirs,
                          tags={"style": spec.style, "vocabulary": spec.vocabulary, "constants": spec.constants, **tags},
                          function_tags={key: {"operation": op} for key, op in self.functions.items()})


@dataclass
class _Names:
    """Draws distinct identifiers from a vocabulary."""

    rng: random.Random
    nouns: tuple[str, ...]
    used: set[str] = field(default_factory=set)

    def fresh(self, make: Callable[[], str]) -> str:
        for _ in range(200):
            name = make()
            if name not in self.used and name.isidentifier():
                self.used.add(name)
                return name
        raise RuntimeError("the vocabulary ran out of names")

    def helper(self) -> str:
        return self.fresh(lambda: f"{self.rng.choice(VERBS)}_{self.rng.choice(self.nouns)}")

    def local(self, taken: set[str], plural: bool = False) -> str:
        """An argument or variable name, distinct within its function (not within the repository)."""
        for _ in range(200):
            noun = self.rng.choice(self.nouns) + ("s" if plural else "")
            if noun not in taken:
                taken.add(noun)
                return noun
        raise RuntimeError("the vocabulary ran out of names")


class _Builder:
    """Builds one helper of an operation; every choice comes from ``rng``."""

    def __init__(self, rng: random.Random, names: _Names, constants: tuple[int, int]) -> None:
        self.rng, self.names, self.low, self.high = rng, names, *constants

    def k(self) -> int:
        return self.rng.randint(self.low, self.high)

    def op(self, choices: str) -> str:
        return self.rng.choice(choices.split())

    def params(self, types: list[str]) -> tuple[list[tuple[str, str]], set[str]]:
        taken: set[str] = set()
        params = [(self.names.local(taken, plural=t == "list"), t) for t in types]
        self.rng.shuffle(params)
        return params, taken

    def build(self, operation: str, earlier: list[Helper], call: Callable[[Helper], str]) -> Helper | None:
        return getattr(self, f"_{operation}")(earlier, call)

    def _arith(self, earlier, call) -> Helper:
        params, taken = self.params(["int", "int"])
        (a, _), (b, _) = sorted(params, key=lambda _: self.rng.random())
        tmp = self.names.local(taken)
        first = f"{a} {self.op('+ - *')} {self.k()}"
        body = [f"{tmp} = {first} {self.op('+ -')} {b} {self.op('* //')} {self.k()}",
                f"return {tmp} {self.op('+ - %')} {self.k()}"]
        if self.rng.random() < 0.5:
            body[1:1] = [f"{tmp} = {tmp} {self.op('* +')} {self.k()}"]
        return Helper("", params, body, "arith", "", returns_int=True)

    def _compare(self, earlier, call) -> Helper:
        params, _ = self.params(["int", "int"])
        (a, _), (b, _) = sorted(params, key=lambda _: self.rng.random())
        test = f"{a} {self.op('< <= > >=')} {b} {self.op('+ -')} {self.k()}"
        body = [f"if {test}:", f"    return {a} {self.op('- +')} {self.k()}"]
        if self.rng.random() < 0.5:
            body += [f"if {b} {self.op('== !=')} {self.k()}:", f"    return {self.k()}"]
        body += [f"return {b} * {self.k()}"]
        return Helper("", params, body, "compare", "", returns_int=True)

    def _string(self, earlier, call) -> Helper:
        params, taken = self.params(["str"])
        (s, _), = params
        head, tail = self.names.local(taken), self.names.local(taken)
        k = self.k()
        form = self.rng.randrange(3)
        if form == 0:
            body = [f"{head} = {s}[:{k}]", f"{tail} = {s}[{k}:]",
                    f"return {tail} + {head}.{self.op('upper title')}()"]
        elif form == 1:
            a, b = self.rng.sample(string.ascii_lowercase[:8], 2)
            body = [f"{head} = {s}.replace({a!r}, {b!r})", f"return {head}[::{self.op('1 -1 2')}] + str(len({s}) "
                    f"{self.op('+ - *')} {k})"]
        else:
            c, combine = self.rng.choice(string.ascii_lowercase[:8]), self.op("+ *")
            # two or more of the letter take the branch, whatever the constant
            body = [f"{head} = {s}.count({c!r}) {combine} {k}", f"if {head} > {k + 1 if combine == '+' else k}:",
                    f"    return {s}[{self.rng.randint(1, 3)}:]", f"return {s} * {head}"]
        return Helper("", params, body, "string", "")

    def _list(self, earlier, call) -> Helper:
        params, taken = self.params(["list"])
        (xs, _), = params
        x = self.names.local(taken)
        form = self.rng.randrange(3)
        if form == 0:
            body = [f"return [{x} {self.op('* +')} {self.k()} for {x} in {xs} if {x} % {self.k()} "
                    f"{self.op('== !=')} 0]"]
        elif form == 1:
            part = self.names.local(taken)
            body = [f"{part} = {xs}[{self.rng.randint(1, 3)}:]", f"return sum({part}) {self.op('- +')} {self.k()} * "
                    f"len({xs})"]
        else:
            body = [f"return max({xs}, default={self.k()}) {self.op('- +')} min({xs}, default=0) "
                    f"{self.op('* +')} {self.k()}"]
        return Helper("", params, body, "list", "", returns_int=form != 0)

    def _loop(self, earlier, call) -> Helper:
        if self.rng.random() < 0.5:
            params, taken = self.params(["list", "int"])
            xs, n = (name for name, kind in sorted(params, key=lambda p: p[1] != "list"))
            total, x = self.names.local(taken), self.names.local(taken)
            body = [f"{total} = {self.k()}", f"for {x} in {xs}:", f"    if {x} {self.op('> >= <')} {n}:",
                    f"        {total} {self.op('+= -=')} {x}", "    else:",
                    f"        {total} {self.op('-= +=')} {self.k()}", f"return {total}"]
        else:
            params, taken = self.params(["int"])
            (n, _), = params
            total, i = self.names.local(taken), self.names.local(taken)
            body = [f"{total} = 0", f"for {i} in range({self.rng.randint(0, 3)}, {n} {self.op('+ -')} {self.k()}):",
                    f"    {total} {self.op('+= -=')} {i} {self.op('* %')} {self.k()}", f"return {total}"]
        return Helper("", params, body, "loop", "", returns_int=True)

    def _early_return(self, earlier, call) -> Helper:
        params, _ = self.params(["list"])
        (xs, _), = params
        body = ["if not " + xs + ":", f"    return {self.k()}", f"if len({xs}) {self.op('> >=')} {self.k() // 2 + 1}:",
                f"    return {xs}[{self.rng.randint(0, 1)}] {self.op('+ -')} {self.k()}",
                f"return {xs}[-1] * {self.k()}"]
        return Helper("", params, body, "early_return", "", returns_int=True)

    def _compose(self, earlier, call) -> Helper | None:
        usable = [h for h in earlier if h.returns_int and all(t == "int" for _, t in h.params)]
        if len(usable) < 2:
            return None
        first, second = self.rng.sample(usable, 2)
        params, taken = self.params(["int", "int"])
        (a, _), (b, _) = params
        tmp = self.names.local(taken)
        body = [f"{tmp} = {call(first)}({a}, {b} {self.op('+ -')} {self.k()})",
                f"return {call(second)}({tmp}, {a}) {self.op('+ - *')} {self.k()}"]
        return Helper("", params, body, "compose", "", returns_int=True)


def _doc(rng: random.Random, helper: Helper, nouns: tuple[str, ...]) -> str:
    args = ", ".join(f"``{name}``" for name, _ in helper.params)
    return rng.choice((f"Combine {args} into a {rng.choice(nouns)} value.",
                       f"The {rng.choice(nouns)} reading of {args}.",
                       f"Work out the {rng.choice(nouns)} for {args}.",
                       f"Return what the {rng.choice(nouns)} rule gives for {args}."))


def _draw_input(rng: random.Random, kind: str, high: int) -> Any:
    if kind == "int":
        return rng.randint(-5, 3 * high)
    if kind == "str":
        return "".join(rng.choice(string.ascii_lowercase[:10]) for _ in range(rng.randint(1, high + 6)))
    return [rng.randint(-10, 3 * high) for _ in range(rng.randint(0, 8))]


def _layout(spec: RepoSpec, modules: list[str]) -> dict[str, str]:
    """Module name -> the repository path of its file."""
    if spec.style == "single":
        return {modules[0]: f"{spec.name}.py"}
    prefix = "src/" if spec.style == "src" else ""
    return {module: f"{prefix}{spec.name}/{module}.py" for module in modules}


def _repository_random(spec: RepoSpec) -> random.Random:
    """Every draw of a repository's text, in order: its nouns first."""
    return seeded_random(spec.seed, "procedural-repo", spec.name, spec.style, spec.vocabulary, spec.constants)


def repository_nouns(spec: RepoSpec) -> tuple[str, ...]:
    """The nouns ``spec``'s repository names its modules, helpers, arguments and variables from."""
    return vocabulary_nouns(spec.vocabulary, _repository_random(spec))


def write_repository(spec: RepoSpec, dest: str) -> GeneratedRepo:
    """Write the repository ``spec`` describes into ``dest`` (created; it must not hold files)."""
    if os.path.isdir(dest) and os.listdir(dest):
        raise FileExistsError(f"{dest} is not empty")
    rng = _repository_random(spec)
    nouns = vocabulary_nouns(spec.vocabulary, rng)
    names = _Names(rng, nouns)
    low, high = CONSTANT_RANGES[spec.constants]
    builder = _Builder(rng, names, (low, high))
    module_count = 1 if spec.style == "single" else min(3, max(1, spec.helpers // 4))
    modules = [spec.name] if spec.style == "single" else [names.fresh(lambda: rng.choice(nouns) + "s")
                                                          for _ in range(module_count)]
    classes = {m: m[:-1].capitalize() + rng.choice(("Ops", "Rules", "Tools")) for m in modules}

    def call(helper: Helper) -> str:
        return f"{classes[helper.module]}.{helper.name}" if spec.style == "classes" else helper.name

    helpers: list[Helper] = []
    while len(helpers) < spec.helpers:
        operation = OPERATIONS[len(helpers) % len(OPERATIONS)] if rng.random() < 0.7 else rng.choice(OPERATIONS)
        module = modules[len(helpers) % len(modules)]
        helper = builder.build(operation, [h for h in helpers if h.module == module], call)
        if helper is None:
            continue
        helper.name, helper.module = names.helper(), module
        helper.doc = _doc(rng, helper, nouns)
        helper.cases = _expected(helper, [h for h in helpers if h.module == module], spec, classes[module], rng, high)
        if helper.cases:
            helpers.append(helper)
    files = _render(spec, modules, classes, helpers, rng, nouns)
    for path, text in files.items():
        target = os.path.join(dest, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(text)
    layout = _layout(spec, modules)
    # the function names bug generation reports: a method's is qualified by its class
    functions = {f"{layout[h.module]}:{classes[h.module] + '.' if spec.style == 'classes' else ''}{h.name}": h.operation
                 for h in helpers}
    return GeneratedRepo(spec, dest, functions)


def _function_text(helper: Helper, indent: str, static: bool) -> list[str]:
    signature = ", ".join(name for name, _ in helper.params)
    lines = [f"{indent}@staticmethod"] if static else []
    lines += [f"{indent}def {helper.name}({signature}):", f'{indent}    """{helper.doc}"""']
    return lines + [f"{indent}    {line}" for line in helper.body]


def _module_text(spec: RepoSpec, module: str, klass: str, helpers: list[Helper]) -> str:
    mine = [h for h in helpers if h.module == module]
    lines = [f'"""The {module} helpers of {spec.name}."""', ""]
    if spec.style == "classes":
        lines += ["", f"class {klass}:", f'    """{klass} rules."""']
        for helper in mine:
            lines += ["", *_function_text(helper, "    ", True)]
    else:
        for helper in mine:
            lines += ["", "", *_function_text(helper, "", False)]
    return "\n".join(lines) + "\n"


def _expected(helper: Helper, earlier: list[Helper], spec: RepoSpec, klass: str, rng: random.Random,
              high: int) -> list[tuple[tuple, Any]]:
    """Five (arguments, result) pairs with at least three distinct results, from running the module's
    code as generated; empty when the helper raises too often or barely depends on its input (a test
    could not catch its bugs)."""
    namespace: dict[str, Any] = {}
    exec(_module_text(spec, helper.module, klass, [*earlier, helper]), namespace)
    function = getattr(namespace[klass], helper.name) if spec.style == "classes" else namespace[helper.name]
    cases: list[tuple[tuple, Any]] = []
    for _ in range(40):
        args = tuple(_draw_input(rng, kind, high) for _, kind in helper.params)
        try:
            result = function(*args)
        except Exception:
            continue
        if isinstance(result, str) and len(result) > 80:
            continue
        cases.append((args, result))
        if len(cases) == 5:
            break
    return cases if len(cases) == 5 and len({repr(r) for _, r in cases}) >= 3 else []


def _render(spec: RepoSpec, modules: list[str], classes: dict[str, str], helpers: list[Helper],
            rng: random.Random, nouns: tuple[str, ...]) -> dict[str, str]:
    layout = _layout(spec, modules)
    files: dict[str, str] = {}
    for module in modules:
        files[layout[module]] = _module_text(spec, module, classes[module], helpers)
    if spec.style != "single":
        init = f"{'src/' if spec.style == 'src' else ''}{spec.name}/__init__.py"
        files[init] = f'"""{spec.name}: generated helpers."""\n'
    for module in modules:
        mine = [h for h in helpers if h.module == module]
        path = spec.name if spec.style == "single" else f"{spec.name}.{module}"
        imported = [classes[module]] if spec.style == "classes" else [h.name for h in mine]
        lines = [f"from {path} import {', '.join(sorted(imported))}"]
        for helper in mine:
            name = f"{classes[module]}.{helper.name}" if spec.style == "classes" else helper.name
            lines += ["", "", f"def test_{helper.name}():"]
            for args, result in helper.cases:
                lines.append(f"    assert {name}({', '.join(map(repr, args))}) == {result!r}")
        files[f"tests/test_{module}.py"] = "\n".join(lines) + "\n"
    if spec.style == "src":
        files["tests/conftest.py"] = ('import os\nimport sys\n\nsys.path.insert(0, os.path.join(os.path.dirname('
                                      'os.path.dirname(os.path.abspath(__file__))), "src"))\n')
    files["pyproject.toml"] = f'[project]\nname = "{spec.name}"\nversion = "0"\n'
    files["README.md"] = f"# {spec.name}\n\nHelpers for {rng.choice(nouns)} work.\n"
    return files

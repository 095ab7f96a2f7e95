"""Generated repositories: every style's tests pass as written, helpers are tagged with their operation,
and the names, constants and layout come from the spec."""

from __future__ import annotations

import ast
import os
import random
import re

import pytest

from orchard.tasks.swe.localtests import run_tests
from orchard.tasks.swe.procedural import (
    CONSTANT_RANGES,
    STYLES,
    SYLLABLES,
    VOCABULARIES,
    RepoSpec,
    renaming,
    repository_nouns,
    write_repository,
)
from orchard.tasks.swe.testlog import passing


def _functions(root: str) -> dict[str, str]:
    """"path:function" -> its source, for every function of the repository's code (not its tests)."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.relpath(os.path.join(directory, name), root)
            if not name.endswith(".py") or path.startswith("tests"):
                continue
            with open(os.path.join(directory, name)) as handle:
                text = handle.read()
            for node in ast.walk(ast.parse(text)):
                for child in getattr(node, "body", []):
                    if isinstance(child, ast.FunctionDef):
                        owner = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
                        found[f"{path}:{owner}{child.name}"] = ast.get_source_segment(text, child)
    return found


@pytest.mark.parametrize("style", STYLES)
def test_each_style_writes_a_repository_whose_tests_pass(style, tmp_path):
    repo = write_repository(RepoSpec("reedkit", style=style, vocabulary="garden", helpers=8, seed=3), str(tmp_path))
    run = run_tests(str(tmp_path), repo.test_dirs)
    assert len(run.results) == 8 and passing(run.results) == set(run.results), run.log[-2000:]
    functions = _functions(str(tmp_path))
    assert set(functions) == set(repo.functions)  # every helper is tagged, by the name bug generation reports
    source = repo.source(axis="train")
    assert source.tags == {"style": style, "vocabulary": "garden", "constants": "small", "axis": "train"}
    assert {tags["operation"] for tags in source.function_tags.values()} <= {"arith", "compare", "string", "list",
                                                                              "loop", "early_return", "compose"}
    if style == "classes":
        assert all("." in key.split(":")[1] for key in repo.functions)
    if style == "src":
        assert all(key.startswith("src/reedkit/") for key in repo.functions)


def test_names_and_constants_come_from_the_spec(tmp_path):
    words = set(VOCABULARIES["workshop"])
    low, high = CONSTANT_RANGES["large"]
    repo = write_repository(RepoSpec("boltkit", vocabulary="workshop", constants="large", helpers=14, seed=0),
                            str(tmp_path))
    for key, code in _functions(str(tmp_path)).items():
        name = key.rsplit(":", 1)[1].rsplit(".", 1)[-1]
        assert name.split("_", 1)[1] in words, name  # verb_noun, the noun from the vocabulary
        arguments = re.match(r"def \w+\((.*)\):", code).group(1).split(", ")
        assert all(a.removesuffix("s") in words for a in arguments), code
        body = code.split('"""')[-1]
        numbers = [int(n) for n in re.findall(r"\b\d+\b", body)]
        assert any(low <= n <= high for n in numbers), code  # its constants are drawn from the range
    assert len(set(repo.functions.values())) >= 5  # the operations vary


def test_coined_names_are_new_in_every_repository_and_its_tests_pass(tmp_path):
    nouns = []
    for name in ("zankit1", "zankit2"):
        repo = write_repository(RepoSpec(name, style="modules", vocabulary="coined", helpers=8, seed=0),
                                str(tmp_path / name))
        run = run_tests(repo.root, repo.test_dirs)
        assert len(run.results) == 8 and passing(run.results) == set(run.results), run.log[-2000:]
        mine = {key.rsplit(":", 1)[1].split("_", 1)[1] for key in repo.functions}
        assert all(re.fullmatch(f"(?:{'|'.join(SYLLABLES)}){{2,3}}", noun) for noun in mine), mine
        assert not mine & {word for words in VOCABULARIES.values() for word in words}
        nouns.append(mine)
    assert not nouns[0] & nouns[1]  # another repository, other names: none can be recalled, only copied


def test_a_repositorys_nouns_are_the_ones_its_names_are_made_of(tmp_path):
    spec = RepoSpec("zankit3", style="single", vocabulary="coined", helpers=8, seed=2)
    repo = write_repository(spec, str(tmp_path / "repo"))
    nouns = repository_nouns(spec)
    assert {key.rsplit(":", 1)[1].split("_", 1)[1] for key in repo.functions} <= set(nouns)
    assert repository_nouns(RepoSpec("mosskit", vocabulary="garden")) == VOCABULARIES["garden"]


def test_renaming_draws_fresh_coined_nouns():
    mapping = renaming(("kovel", "zantri"), random.Random(0), avoid=("pelmu",))
    assert set(mapping) == {"kovel", "zantri"} and not set(mapping.values()) & {"kovel", "zantri", "pelmu"}
    assert all(re.fullmatch(f"(?:{'|'.join(SYLLABLES)}){{2,3}}", new) for new in mapping.values())


def test_a_seed_draws_a_different_repository_and_the_same_seed_the_same(tmp_path):
    spec = RepoSpec("mosskit", helpers=6, seed=0)
    first = write_repository(spec, str(tmp_path / "a"))
    again = write_repository(spec, str(tmp_path / "b"))
    other = write_repository(RepoSpec("mosskit", helpers=6, seed=1), str(tmp_path / "c"))
    assert _functions(first.root) == _functions(again.root)
    assert _functions(first.root) != _functions(other.root)


def test_bad_specs_and_targets_are_refused(tmp_path):
    for bad, match in (({"style": "flat"}, "unknown style"), ({"vocabulary": "ocean"}, "unknown vocabulary"),
                       ({"constants": "huge"}, "unknown constant range"), ({"helpers": 1}, "at least 2")):
        with pytest.raises(ValueError, match=match):
            RepoSpec("kit", **bad)
    with pytest.raises(ValueError, match="identifier"):
        RepoSpec("my-kit")
    (tmp_path / "kept.txt").write_text("x")
    with pytest.raises(FileExistsError):
        write_repository(RepoSpec("kit"), str(tmp_path))

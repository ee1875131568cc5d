"""The checker and the system under test share no code (STYLE rule 2; SPEC section 2).

`fakes/` has its own description of the protocol (`fakes.gym.protocol.wire`), so it must import nothing from
`ckpt_model`: a schema both sides import would let a misreading of Gym's protocol hide on both sides at once. And `src/`
must import nothing from `fakes/`: the checker reaches a deployment only through its deployment seam.

Imports are read with `ast`, so nothing here is imported or run; `importlib.import_module("...")` and
`__import__("...")` calls with a literal module name count as imports too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "fakes"
SRC = ROOT / "src" / "ckpt_model"
DYNAMIC_IMPORTS = ("import_module", "__import__")


def _imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) for every absolute import in `tree`, at any depth (functions, `if TYPE_CHECKING`, ...)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args:
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            first = node.args[0]
            if name in DYNAMIC_IMPORTS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def _imports_of(package: Path, forbidden: str) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in _imported_modules(tree):
            if module == forbidden or module.startswith(forbidden + "."):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


def test_the_tree_is_where_this_test_expects_it() -> None:
    assert (FAKES / "gym" / "protocol" / "wire.py").is_file()
    assert (SRC / "protocol" / "wire.py").is_file()


def test_fakes_import_nothing_from_the_checker() -> None:
    assert _imports_of(FAKES, "ckpt_model") == []


def test_the_checker_imports_nothing_from_fakes() -> None:
    assert _imports_of(SRC, "fakes") == []


def test_the_import_scan_sees_every_kind_of_import() -> None:
    source = (
        "import ckpt_model\n"
        "import ckpt_model.protocol.wire as w\n"
        "from ckpt_model.protocol.wire import EpisodeId\n"
        "def f():\n"
        "    from ckpt_model import coordination\n"
        "    importlib.import_module('ckpt_model.protocol.storage')\n"
        "from . import ckpt_model\n"
        "import ckpt_model_other\n"
    )
    found = sorted(_imported_modules(ast.parse(source)))
    assert found == [
        (1, "ckpt_model"),
        (2, "ckpt_model.protocol.wire"),
        (3, "ckpt_model.protocol.wire"),
        (5, "ckpt_model"),
        (6, "ckpt_model.protocol.storage"),
        (8, "ckpt_model_other"),
    ]

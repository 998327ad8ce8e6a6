"""The import graph of src/: no cycles, and no module imports a layer above its own
(tools/check_imports.py, which `make lint` runs too)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from textwrap import dedent
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load_checker() -> ModuleType:
    path = ROOT / "tools" / "check_imports.py"
    spec = importlib.util.spec_from_file_location("check_imports", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_imports", module)
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text), encoding="utf-8")
    return root


def _edges(src: Path) -> dict[str, set[str]]:
    modules = checker.find_modules(src)
    checker.collect_imports(modules)
    return {name: set(module.imports) for name, module in modules.items()}


def test_src_has_no_cycles_and_no_layer_violations() -> None:
    problems, modules, cycles = checker.check(ROOT / "src")
    assert problems == []
    assert cycles == 0
    assert modules > 50  # the whole package was read


def test_the_engine_and_the_protocol_are_below_the_high_level_modules() -> None:
    def layer(name: str) -> int:
        number = checker.layer_of(name)
        assert number is not None, name
        return int(number)

    for low in ("rabbitry.protocol.channel", "rabbitry.aio.connection", "rabbitry.aio.channel"):
        for high in ("rabbitry.publisher", "rabbitry.consumer", "rabbitry.pool", "rabbitry.rpc"):
            assert layer(low) < layer(high)
    assert layer("rabbitry.protocol.frames") < layer("rabbitry.aio.channel")
    assert layer("rabbitry.exceptions") < layer("rabbitry.protocol.spec")


def test_a_cycle_through_type_checking_and_a_function_is_found(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": """
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from .b import B
            """,
            "pkg/b.py": """
                def make():
                    from .c import C
                    return C()
            """,
            "pkg/c.py": "from pkg.a import A\n",
        },
    )
    problems, modules, cycles = checker.check(src)
    assert (modules, cycles) == (4, 1)
    assert len(problems) == 1
    assert "cycle among 3 modules: pkg.a, pkg.b, pkg.c" in problems[0]
    # Each edge of the cycle is printed with its file, its line and the imported names.
    assert "pkg/a.py:5 -> pkg.b (B)" in problems[0]
    assert "pkg/b.py:3 -> pkg.c (C)" in problems[0]
    assert "pkg/c.py:1 -> pkg.a (A)" in problems[0]


def test_names_re_exported_by_a_package_are_edges_to_its_init(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .sub.impl import Thing\n",
            "pkg/sub/__init__.py": "from .impl import Thing\n",
            "pkg/sub/impl.py": "from .. import helper\nfrom ..helper import util\n",
            "pkg/helper.py": "from .sub import Thing\n",
            "pkg/other.py": "from . import helper, VERSION\nimport pkg.sub.impl\n",
        },
    )
    edges = _edges(src)
    # `from . import helper`: a submodule; `from . import VERSION`: a name of __init__.
    assert edges["pkg.other"] == {"pkg.helper", "pkg", "pkg.sub.impl"}
    assert edges["pkg.sub.impl"] == {"pkg.helper"}
    # `from .sub import Thing`: Thing comes from pkg/sub/__init__.py, which imports
    # impl, which imports helper: a cycle through the re-export.
    assert edges["pkg.helper"] == {"pkg.sub"}
    problems, _, cycles = checker.check(src)
    assert cycles == 1
    assert "pkg.helper, pkg.sub, pkg.sub.impl" in problems[0]


def test_an_import_from_a_higher_layer_is_reported(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "rabbitry/__init__.py": "",
            "rabbitry/exceptions.py": "",
            "rabbitry/aio/__init__.py": "",
            "rabbitry/aio/connection.py": """
                def publisher():
                    from ..publisher import AsyncPublisher
                    return AsyncPublisher
            """,
            "rabbitry/publisher.py": "from .exceptions import *\n",
        },
    )
    problems, _, cycles = checker.check(src)
    assert cycles == 0
    assert problems == [
        "layer violation: rabbitry.aio.connection (engine) imports rabbitry.publisher "
        "(high-level): rabbitry/aio/connection.py:3 -> rabbitry.publisher (AsyncPublisher)"
    ]


def test_a_module_in_no_layer_is_reported(tmp_path: Path) -> None:
    src = _write(tmp_path, {"rabbitry/__init__.py": "", "rabbitry/newcomer.py": ""})
    problems, _, _ = checker.check(src)
    assert problems == ["rabbitry/newcomer.py: rabbitry.newcomer is in no layer"]


@pytest.mark.parametrize("clean", [True, False])
def test_main_exit_status(tmp_path: Path, clean: bool, capsys: pytest.CaptureFixture[str]) -> None:
    files = {"pkg/__init__.py": "", "pkg/a.py": "from . import b\n", "pkg/b.py": ""}
    if not clean:
        files["pkg/b.py"] = "from . import a\n"
    assert checker.main([str(_write(tmp_path, files))]) == (0 if clean else 1)
    out = capsys.readouterr()
    assert ("0 import cycles" in out.out) is clean
    assert ("1 import cycles" in out.err) is not clean

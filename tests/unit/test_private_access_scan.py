"""The scan of ``test_private_access`` on small packages written to a temporary
directory: each rule catches its case, and what the rules allow stays allowed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from test_private_access import parse_package, scan

if TYPE_CHECKING:
    from pathlib import Path


def _scan_of(tmp_path: Path, sources: dict[str, str]) -> list[str]:
    """``"path:line"`` of each violation in a package made of ``sources``."""
    for path, text in sources.items():
        file = tmp_path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text, encoding="utf-8")
    return [f"{v.module}:{v.line}" for v in scan(parse_package(tmp_path))]


_OWNERS = {
    "a.py": "class A:\n    def __init__(self):\n        self._x = 1\n",
    "b.py": "from .a import A\n"
    "class B:\n"
    "    _x = 2\n"
    "    def __init__(self, other: A | None):\n"
    "        self._other = other\n",
}


def test_a_name_both_modules_define_is_a_violation_unless_provably_local(tmp_path: Path) -> None:
    found = _scan_of(
        tmp_path,
        _OWNERS
        | {
            "c.py": "from .b import B\n"
            "class C:\n"
            "    _x = 3\n"
            "def unknown(obj):\n"
            "    return obj._x\n"  # 5: could be an A or a B
            "def declared(obj: C, maybe: 'C | None', n: B):\n"
            "    return obj._x, maybe._x, n._x\n"  # 7: n is a B of module b
            "def built():\n"
            "    c = C()\n"
            "    return c._x, C._x\n"
            "def rebound(obj: C):\n"
            "    obj._x = 1\n"
            "    for obj in []:\n"
            "        pass\n"
            "def looped(items):\n"
            "    for item in items:\n"
            "        item._x\n"  # 17: a loop target is not known
            "def narrowed(obj):\n"
            "    if isinstance(obj, C):\n"
            "        obj._x\n"
            "    return isinstance(obj, C) and obj._x, not isinstance(obj, C) or obj._x\n",
        },
    )
    assert found == ["c.py:5", "c.py:7", "c.py:17"]


def test_a_self_attribute_is_known_by_what_the_class_assigns_it(tmp_path: Path) -> None:
    found = _scan_of(
        tmp_path,
        _OWNERS
        | {
            "c.py": "class C:\n"
            "    _x = 3\n"
            "class D:\n"
            "    def __init__(self, c: C, anything):\n"
            "        self.c = c\n"
            "        self.built = C()\n"
            "        self.anything = anything\n"
            "    def use(self):\n"
            "        return self.c._x, self.built._x, self.anything._x\n",
        },
    )
    assert found == ["c.py:9"]


def test_a_protocol_or_a_subclass_of_another_module_makes_no_access_local(
    tmp_path: Path,
) -> None:
    found = _scan_of(
        tmp_path,
        _OWNERS
        | {
            "c.py": "from typing import Any, Protocol\n"
            "from .a import A\n"
            "class Shape(Protocol):\n"
            "    _x: int\n"
            "class Sub(A):\n"
            "    pass\n"
            "def f(s: Shape, sub: Sub, anything: Any):\n"
            "    return s._x, sub._x, anything._x\n",
        },
    )
    assert found == ["c.py:8", "c.py:8", "c.py:8"]


def test_an_object_of_a_class_from_outside_the_package_is_not_the_packages(
    tmp_path: Path,
) -> None:
    found = _scan_of(
        tmp_path,
        {
            "a.py": "class A:\n    _exception = None\n",
            "b.py": "import asyncio\n"
            "import concurrent.futures\n"
            "from typing import Any\n"
            "def peek(f: asyncio.Future[Any] | concurrent.futures.Future[Any], g: Any):\n"
            "    return f._exception, g._exception\n",
        },
    )
    assert found == ["b.py:5"]


def test_private_names_of_other_modules_are_violations(tmp_path: Path) -> None:
    found = _scan_of(
        tmp_path,
        {
            "a.py": "_limit = 1\ndef _helper(): ...\n",
            "b.py": "from .a import _limit\nfrom .a import _helper as _helper\n",
            "c.py": "from . import a\nx = a._helper()\na._limit = 2\n",
            "d.py": "import rabbitry.a\nrabbitry.a._helper()\n",
            "e.py": "import rabbitry.a as alias\ndef f():\n    return alias._limit\n",
        },
    )
    assert found == ["b.py:1", "b.py:2", "c.py:2", "c.py:3", "d.py:2", "e.py:3"]


def test_private_names_reached_by_a_string_are_violations(tmp_path: Path) -> None:
    found = _scan_of(
        tmp_path,
        {
            "d.py": "def f(obj):\n"
            "    getattr(obj, '_state')\n"
            "    hasattr(obj, '_x')\n"
            "    setattr(obj, '_x', 1)\n"
            "    delattr(obj, '_x')\n"
            "    getattr(obj, '__doc__')\n"
            "    getattr(obj, 'public')\n",
        },
    )
    assert found == ["d.py:2", "d.py:3", "d.py:4", "d.py:5"]


def test_own_members_private_modules_and_outside_names_stay_allowed(tmp_path: Path) -> None:
    found = _scan_of(
        tmp_path,
        _OWNERS
        | {
            "sub/__init__.py": "",
            "sub/_portal.py": "class Portal:\n    pass\n",
            "e.py": "import sys\n"
            "import rabbitry.sub._portal\n"
            "from os import _exit\n"
            "from . import sub\n"
            "from .sub import _portal\n"
            "from .sub._portal import Portal\n"
            "from .a import A\n"
            "portal = sub._portal.Portal, rabbitry.sub._portal.Portal, sys._getframe\n"
            "class E(A):\n"
            "    def g(self):\n"
            "        super()._x\n"
            "        return self._x, getattr(self, '_x'), getattr(cls, '_x')\n"
            "    @classmethod\n"
            "    def h(cls):\n"
            "        return cls._x\n",
        },
    )
    assert found == []

#!/usr/bin/env python3
"""Generate ``src/rabbitry/protocol/spec.py`` from RabbitMQ's machine-readable spec.

Usage::

    python tools/gen_spec.py            # rewrite spec.py
    python tools/gen_spec.py --check    # exit 1 if spec.py differs from what would be written

The input is RabbitMQ's machine-readable AMQP 0-9-1 spec, ``amqp-rabbitmq-0.9.1.json``
from RabbitMQ's code-generation project, kept in ``tools/spec/`` with its notices (see
the README there); ``--spec`` names another file. The generated ``spec.py`` is
committed, so only the generator and its drift test read the JSON.

For each method the generator writes a slotted class whose ``encode``/``decode`` are
straight-line code: runs of fixed-size arguments (octets, shorts, longs, packed bits and
the length octet of the following string) are packed or unpacked with one precompiled
``struct.Struct`` call. Strings, long strings and tables go through ``frames.py``.
"""

from __future__ import annotations

import argparse
import json
import keyword
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "tools" / "spec" / "amqp-rabbitmq-0.9.1.json"
OUTPUT = ROOT / "src" / "rabbitry" / "protocol" / "spec.py"

FIXED = {
    "octet": ("B", 1),
    "short": ("H", 2),
    "long": ("I", 4),
    "longlong": ("Q", 8),
    "timestamp": ("Q", 8),
}
PY_TYPES = {
    "octet": "int",
    "short": "int",
    "long": "int",
    "longlong": "int",
    "timestamp": "int",
    "bit": "bool",
    "shortstr": "str",
    "longstr": "bytes",
    "table": "dict[str, Any]",
}
# Requests whose answers are not simply "<name>-ok".
EXTRA_RESPONSES = {"basic.get": ["basic.get-ok", "basic.get-empty"]}
# Methods the client never sends but the generator still pairs (kept for completeness).


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def pyname(name: str) -> str:
    ident = name.replace("-", "_")
    return ident + "_" if keyword.iskeyword(ident) else ident


def const_name(name: str) -> str:
    return name.replace("-", "_").upper()


def resolve(domains: dict[str, str], arg: dict[str, object]) -> str:
    kind = arg.get("type") or arg["domain"]
    assert isinstance(kind, str)
    while kind in domains and domains[kind] != kind:
        kind = domains[kind]
    return kind


class Emitter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.structs: dict[str, str] = {}

    def struct(self, fmt: str) -> str:
        """Name of a module-level precompiled Struct for ``fmt``."""
        if fmt not in self.structs:
            self.structs[fmt] = f"_S_{fmt}"
        return self.structs[fmt]

    def __call__(self, line: str = "") -> None:
        self.lines.append(line)


def default_literal(kind: str, value: object) -> str | None:
    if value is None:
        return None
    if kind == "bit":
        return repr(bool(value))
    if kind == "table":
        return "None"
    if kind == "longstr":
        return repr(str(value).encode())
    return repr(value)


def gen_encode(out: Emitter, method_name: str, args: list[tuple[str, str]]) -> None:
    """Emit ``encode`` for one method."""
    out("    def encode(self) -> bytes:")
    if not args:
        out('        return b""')
        out()
        return
    out("        try:")
    parts: list[str] = []
    fmt = ""
    values: list[str] = []
    pre: list[str] = []
    bits: list[str] = []

    def flush_bits() -> None:
        nonlocal fmt
        if bits:
            expr = " | ".join(f"({1 << i} if self.{b} else 0)" for i, b in enumerate(bits))
            fmt += "B"
            values.append(expr)
            bits.clear()

    def flush() -> None:
        nonlocal fmt
        flush_bits()
        if fmt:
            parts.append(f"{out.struct(fmt)}.pack({', '.join(values)})")
            fmt = ""
            values.clear()

    for index, (name, kind) in enumerate(args):
        if kind != "bit":
            flush_bits()
        if kind in FIXED:
            code, _ = FIXED[kind]
            fmt += code
            if kind == "timestamp":
                values.append(f"split_timestamp(self.{name}, {method_name + '.' + name!r})")
            else:
                values.append(f"self.{name}")
        elif kind == "bit":
            bits.append(name)
            if len(bits) == 8:
                flush_bits()
        elif kind == "shortstr":
            var = f"_s{index}"
            pre.append(f'{var} = self.{name}.encode("utf-8", "surrogateescape")')
            fmt += "B"
            values.append(f"len({var})")
            flush()
            parts.append(var)
        elif kind == "longstr":
            flush()
            parts.append(f"encode_longstr(self.{name})")
        elif kind == "table":
            flush()
            parts.append(f"encode_table(self.{name}, {method_name + '.' + name!r})")
        else:
            raise SystemExit(f"unknown type {kind}")
    flush()
    for line in pre:
        out(f"            {line}")
    out(f"            return {' + '.join(parts)}")
    out("        except LocalProtocolError:")
    out("            raise")
    out("        except (struct.error, AttributeError, TypeError, UnicodeError) as exc:")
    out("            raise self.encode_error(exc) from exc")
    out()


def gen_decode(out: Emitter, cls: str, args: list[tuple[str, str]]) -> None:
    """Emit ``decode`` for one method."""
    out("    @classmethod")
    out(f"    def decode(cls, buf: bytes, offset: int) -> tuple[{cls}, int]:")
    out("        self = cls.__new__(cls)")
    fmt = ""
    targets: list[str] = []
    size = 0
    bit_groups: list[tuple[str, list[str]]] = []
    bits: list[str] = []
    lines: list[str] = []
    counter = [0]

    def flush_bits() -> None:
        nonlocal fmt, size
        if bits:
            var = f"_b{counter[0]}"
            counter[0] += 1
            fmt += "B"
            size += 1
            targets.append(var)
            bit_groups.append((var, list(bits)))
            bits.clear()

    def flush() -> None:
        nonlocal fmt, size
        flush_bits()
        if fmt:
            target = ", ".join(targets) + ("," if len(targets) == 1 else "")
            lines.append(f"{target} = {out.struct(fmt)}.unpack_from(buf, offset)")
            lines.append(f"offset += {size}")
            for var, names in bit_groups:
                for i, bit in enumerate(names):
                    lines.append(f"self.{bit} = bool({var} & {1 << i})")
            bit_groups.clear()
            fmt = ""
            size = 0
            targets.clear()

    for index, (name, kind) in enumerate(args):
        if kind != "bit":
            flush_bits()
        if kind in FIXED:
            code, width = FIXED[kind]
            fmt += code
            size += width
            targets.append(f"self.{name}")
        elif kind == "bit":
            bits.append(name)
            if len(bits) == 8:
                flush_bits()
        elif kind in ("shortstr", "longstr"):
            var = f"_n{index}"
            code, width = ("B", 1) if kind == "shortstr" else ("I", 4)
            fmt += code
            size += width
            targets.append(var)
            flush()
            if kind == "shortstr":
                lines.append(
                    f'self.{name} = buf[offset : offset + {var}].decode("utf-8", "surrogateescape")'
                )
            else:
                lines.append(f"self.{name} = bytes(buf[offset : offset + {var}])")
            lines.append(f"offset += {var}")
        elif kind == "table":
            flush()
            lines.append(f"self.{name}, offset = decode_table(buf, offset)")
    flush()
    for line in lines:
        out(f"        {line}")
    out("        return self, offset")
    out()


def generate(spec_path: Path) -> str:
    spec = json.loads(spec_path.read_text())
    domains = {name: kind for name, kind in spec["domains"]}
    out = Emitter()
    body = Emitter()
    body.structs = out.structs
    classes: list[tuple[str, str, int, int]] = []  # (pyclass, dotted name, class id, method id)
    responses: dict[str, list[str]] = {}

    for amqp_class in spec["classes"]:
        cname = amqp_class["name"]
        names = {m["name"] for m in amqp_class["methods"]}
        for method in amqp_class["methods"]:
            mname = method["name"]
            dotted = f"{cname}.{mname}"
            pycls = camel(cname) + camel(mname)
            classes.append((pycls, dotted, amqp_class["id"], method["id"]))
            if method.get("synchronous"):
                answers = EXTRA_RESPONSES.get(dotted)
                if answers is None and f"{mname}-ok" in names:
                    answers = [f"{cname}.{mname}-ok"]
                responses[dotted] = answers or []
            args = [(pyname(a["name"]), resolve(domains, a)) for a in method["arguments"]]
            body()
            body()
            body(f"class {pycls}(Method):")
            body(f'    """``{dotted}`` ({amqp_class["id"]}, {method["id"]})."""')
            body()
            body(f"    __slots__ = ({''.join(repr(n) + ', ' for n, _ in args)})")
            body()
            body(f"    CLASS_ID = {amqp_class['id']}")
            body(f"    METHOD_ID = {method['id']}")
            body(f"    INDEX = 0x{(amqp_class['id'] << 16) | method['id']:08X}")
            body(f"    NAME = {dotted!r}")
            body(f"    SYNCHRONOUS = {bool(method.get('synchronous'))}")
            body(f"    CONTENT = {bool(method.get('content'))}")
            body(f"    FIELDS = ({''.join(repr(n) + ', ' for n, _ in args)})")
            body(f"    FIELD_TYPES = ({''.join(repr(k) + ', ' for _, k in args)})")
            body(
                f"    PREFIX = {bytes([amqp_class['id'] >> 8, amqp_class['id'] & 255, method['id'] >> 8, method['id'] & 255])!r}"
            )
            body()
            for name, kind in args:
                body(
                    f"    {name}: {PY_TYPES[kind] if kind != 'table' else 'dict[str, Any] | None'}"
                )
            if args:
                body()
                params = []
                for (name, kind), raw in zip(args, method["arguments"], strict=True):
                    default = default_literal(kind, raw.get("default-value"))
                    if default is None and kind == "bit":
                        default = "False"
                    if default is None and kind == "table":
                        default = "None"
                    annotation = "Any" if kind == "table" else PY_TYPES[kind]
                    if kind == "table":
                        annotation = "Mapping[str, Any] | None"
                    if kind == "longstr":
                        annotation = "bytes | str"
                    if kind == "timestamp":
                        annotation = "int | datetime"
                    params.append(
                        f"{name}: {annotation}" + (f" = {default}" if default is not None else "")
                    )
                body(f"    def __init__(self, *, {', '.join(params)}) -> None:")
                for name, kind in args:
                    if kind == "table":
                        body(f"        self.{name} = dict({name}) if {name} is not None else None")
                    elif kind in ("longstr", "timestamp"):
                        # Stored as given; encode() accepts both forms.
                        body(f"        self.{name} = {name}  # type: ignore[assignment]")
                    else:
                        body(f"        self.{name} = {name}")
                body()
            gen_encode(body, dotted, args)
            gen_decode(body, pycls, args)

    # Properties: only the basic class carries content in 0-9-1 as RabbitMQ uses it.
    props: list[tuple[str, str]] = []
    for amqp_class in spec["classes"]:
        if amqp_class["name"] == "basic":
            props = [(pyname(p["name"]), resolve(domains, p)) for p in amqp_class["properties"]]
    gen_properties(body, props)

    out('"""AMQP 0-9-1 methods and basic properties, with RabbitMQ\'s extensions.')
    out()
    out("GENERATED by tools/gen_spec.py from RabbitMQ's amqp-rabbitmq-0.9.1.json.")
    out("Do not edit: change the generator and run it again (a test fails on drift).")
    out('"""')
    out()
    out("# ruff: noqa")
    out("from __future__ import annotations")
    out()
    out("import struct")
    out("from collections.abc import Mapping")
    out("from datetime import UTC, datetime")
    out("from typing import Any")
    out()
    out("from ..exceptions import LocalProtocolError, RemoteProtocolError")
    out("from .frames import (")
    out("    Method,")
    out("    check_field,")
    out("    decode_table,")
    out("    decode_timestamp,")
    out("    encode_longstr,")
    out("    encode_table,")
    out("    split_timestamp,")
    out(")")
    out()
    out("__all__ = [")
    for name in sorted(
        [
            "BasicProperties",
            "METHODS",
            "decode_method",
            "method_name",
            "REPLY_CODES",
            *(c[0] for c in classes),
        ]
    ):
        out(f"    {name!r},")
    out("]")
    out()
    out(f"PORT = {spec['port']}")
    out(f"VERSION = ({spec['major-version']}, {spec['minor-version']}, {spec['revision']})")
    for const in spec["constants"]:
        out(f"{const_name(const['name'])} = {const['value']}")
    out()
    out("#: reply code -> (name, 'soft-error' | 'hard-error' | '')")
    out("REPLY_CODES: dict[int, tuple[str, str]] = {")
    for const in spec["constants"]:
        if const["value"] == 200 or "class" in const:
            out(f"    {const['value']}: ({const['name']!r}, {const.get('class', '')!r}),")
    out("}")
    out()
    out.struct("HH")
    # Struct definitions must come before the classes that use them; body refers by name,
    # so emit them here from the collected set.
    for fmt, var in sorted(out.structs.items()):
        out(f'{var} = struct.Struct(">{fmt}")')
    out.lines.extend(body.lines)
    out()
    out()
    out("METHODS: dict[int, type[Method]] = {")
    for pycls, *_ in classes:
        out(f"    {pycls}.INDEX: {pycls},")
    out("}")
    out()
    out("_NAMES: dict[int, str] = {cls.INDEX: cls.NAME for cls in METHODS.values()}")
    out()
    by_dotted = {dotted: pycls for pycls, dotted, *_ in classes}
    for dotted, answers in responses.items():
        if answers:
            out(
                f"{by_dotted[dotted]}.RESPONSES = ({''.join(by_dotted[a] + ', ' for a in answers)})"
            )
    out()
    out()
    out("def method_name(class_id: int, method_id: int) -> str:")
    out('    """Dotted name of a method (``"queue.declare"``), or the raw ids if unknown."""')
    out('    return _NAMES.get((class_id << 16) | method_id, f"{class_id}.{method_id}")')
    out()
    out()
    out("def decode_method(payload: bytes) -> Method:")
    out('    """Decode a method frame payload.')
    out()
    out("    Raises:")
    out("        RemoteProtocolError: unknown method (540) or malformed arguments (502).")
    out('    """')
    out("    try:")
    out("        class_id, method_id = _S_HH.unpack_from(payload, 0)")
    out("    except struct.error:")
    out('        raise RemoteProtocolError("method frame shorter than 4 bytes", 502) from None')
    out("    cls = METHODS.get((class_id << 16) | method_id)")
    out("    if cls is None:")
    out("        raise RemoteProtocolError(")
    out('            f"unknown method class {class_id} method {method_id}", 540')
    out("        )")
    out("    try:")
    out("        method, end = cls.decode(payload, 4)")
    out("    except RemoteProtocolError:")
    out("        raise")
    out("    except (struct.error, IndexError, ValueError, OverflowError, RecursionError) as exc:")
    out('        raise RemoteProtocolError(f"malformed {cls.NAME}: {exc}", 502) from None')
    out("    if end != len(payload):")
    out("        raise RemoteProtocolError(")
    out('            f"malformed {cls.NAME}: {len(payload) - end} bytes left over or missing", 502')
    out("        )")
    out("    return method")
    out()
    return "\n".join(out.lines) + "\n"


def gen_properties(out: Emitter, props: list[tuple[str, str]]) -> None:
    out()
    out()
    out("class BasicProperties:")
    out('    """The 14 basic content properties (AMQP 0-9-1 class ``basic``).')
    out()
    out("    Every property is optional; ``None`` means absent (not sent). ``timestamp`` takes")
    out("    a ``datetime`` (naive means UTC) or POSIX seconds and decodes to an aware")
    out("    ``datetime``. ``expiration`` must be a string of digits (milliseconds) and")
    out("    ``delivery_mode`` 1 or 2, as RabbitMQ requires. Instances compare by value.")
    out('    """')
    out()
    out(f"    __slots__ = ({''.join(repr(n) + ', ' for n, _ in props)})")
    out(f"    FIELDS = ({''.join(repr(n) + ', ' for n, _ in props)})")
    out(f"    FIELD_TYPES = ({''.join(repr(k) + ', ' for _, k in props)})")
    out()
    for name, kind in props:
        ann = {"table": "dict[str, Any] | None", "timestamp": "int | datetime | None"}.get(
            kind, f"{PY_TYPES[kind]} | None"
        )
        out(f"    {name}: {ann}")
    out()
    params = []
    for name, kind in props:
        ann = {"table": "Mapping[str, Any] | None", "timestamp": "int | datetime | None"}.get(
            kind, f"{PY_TYPES[kind]} | None"
        )
        params.append(f"{name}: {ann} = None")
    out(f"    def __init__(self, *, {', '.join(params)}) -> None:")
    for name, kind in props:
        if kind == "table":
            out(f"        self.{name} = dict({name}) if {name} is not None else None")
        else:
            out(f"        self.{name} = {name}")
    out()
    out("    def encode(self) -> bytes:")
    out('        """Encode the property flags and the present values."""')
    out("        flags = 0")
    out("        parts: list[bytes] = []")
    out("        try:")
    for index, (name, kind) in enumerate(props):
        bit = 1 << (15 - index)
        path = f"basic.properties.{name}"
        out(f"            v{index} = self.{name}")
        out(f"            if v{index} is not None:")
        out(f"                flags |= 0x{bit:04X}")
        if kind == "shortstr":
            if name == "expiration":
                out(f"                if not (v{index}.isascii() and v{index}.isdigit()):")
                out("                    raise LocalProtocolError(")
                out(
                    f'                        "{path}: must be a string of digits (milliseconds), "'
                )
                out(f'                        f"got {{v{index}!r}}"')
                out("                    )")
            out(f'                raw = v{index}.encode("utf-8", "surrogateescape")')
            out("                parts.append(_S_B.pack(len(raw)))")
            out("                parts.append(raw)")
        elif kind == "table":
            out(f"                parts.append(encode_table(v{index}, {path!r}))")
        elif kind == "octet":
            if name == "delivery_mode":
                # RabbitMQ closes the channel (406) on any other value.
                out(f"                if v{index} != 1 and v{index} != 2:")
                out("                    raise LocalProtocolError(")
                out(f'                        "{path}: must be 1 (transient) or 2 (persistent), "')
                out(f'                        f"got {{v{index}!r}}"')
                out("                    )")
            out(f"                parts.append(_S_B.pack(v{index}))")
        elif kind == "timestamp":
            out(f"                parts.append(_S_Q.pack(split_timestamp(v{index}, {path!r})))")
        elif kind == "longstr":
            out(f"                parts.append(encode_longstr(v{index}))")
        else:
            raise SystemExit(f"unexpected property type {kind}")
    out("        except LocalProtocolError:")
    out("            raise")
    out("        except (struct.error, AttributeError, TypeError, UnicodeError) as exc:")
    out("            for name, kind in zip(self.FIELDS, self.FIELD_TYPES):")
    out("                value = getattr(self, name)")
    out("                problem = None if value is None else check_field(value, kind)")
    out("                if problem:")
    out(
        '                    raise LocalProtocolError(f"basic.properties.{name}: {problem}") from exc'
    )
    out('            raise LocalProtocolError(f"basic.properties: cannot encode ({exc})") from exc')
    out('        return _S_H.pack(flags) + b"".join(parts)')
    out()
    out("    @classmethod")
    out("    def decode(cls, buf: bytes, offset: int) -> tuple[BasicProperties, int]:")
    out('        """Decode the property flags and the present values at ``offset``.')
    out()
    out("        Args:")
    out("            buf: the content header payload.")
    out("            offset: where the property flags start in ``buf``.")
    out()
    out("        Returns:")
    out("            ``(properties, offset after them)``.")
    out()
    out("        Raises:")
    out("            RemoteProtocolError: the flags ask for a continuation, or the headers")
    out("                table is malformed (reply code 502). Truncated or malformed input may")
    out("                also raise ``struct.error``, ``IndexError``, ``ValueError`` or")
    out("                ``OverflowError``: the content header parser turns each into a")
    out("                :class:`RemoteProtocolError`.")
    out('        """')
    out("        self = cls.__new__(cls)")
    out("        (flags,) = _S_H.unpack_from(buf, offset)")
    out("        offset += 2")
    out("        if flags & 1:")
    out(
        '            raise RemoteProtocolError("property flags continuation is not supported", 502)'
    )
    for index, (name, kind) in enumerate(props):
        bit = 1 << (15 - index)
        out(f"        if flags & 0x{bit:04X}:")
        if kind == "shortstr":
            out("            n = buf[offset]")
            out(
                f'            self.{name} = buf[offset + 1 : offset + 1 + n].decode("utf-8", "surrogateescape")'
            )
            out("            offset += 1 + n")
        elif kind == "table":
            out(f"            self.{name}, offset = decode_table(buf, offset)")
        elif kind == "octet":
            out(f"            self.{name} = buf[offset]")
            out("            offset += 1")
        elif kind == "timestamp":
            out(f"            self.{name} = decode_timestamp(_S_Q.unpack_from(buf, offset)[0])")
            out("            offset += 8")
        out("        else:")
        out(f"            self.{name} = None")
    out("        return self, offset")
    out()
    out("    def __eq__(self, other: object) -> bool:")
    out("        if not isinstance(other, BasicProperties):")
    out("            return NotImplemented")
    out("        return all(getattr(self, n) == getattr(other, n) for n in self.FIELDS)")
    out()
    out("    __hash__ = None  # type: ignore[assignment]")
    out()
    out("    def __repr__(self) -> str:")
    out('        args = ", ".join(')
    out(
        '            f"{n}={getattr(self, n)!r}" for n in self.FIELDS if getattr(self, n) is not None'
    )
    out("        )")
    out('        return f"Properties({args})"')
    out.struct("B")
    out.struct("H")
    out.struct("Q")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--check", action="store_true", help="fail if the output would change")
    options = parser.parse_args()
    text = generate(options.spec)
    if options.check:
        current = options.output.read_text() if options.output.exists() else ""
        if current != text:
            print(f"{options.output} is out of date: run tools/gen_spec.py", file=sys.stderr)
            return 1
        return 0
    options.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

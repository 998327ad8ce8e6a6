"""``spec.py`` is generated: it must match its generator and RabbitMQ's JSON spec."""

from __future__ import annotations

import json
import keyword
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rabbitry.protocol import frames, spec
from rabbitry.protocol.frames import Method

ROOT = Path(__file__).resolve().parents[3]
GENERATOR = ROOT / "tools" / "gen_spec.py"
SPEC_JSON = ROOT / "tools" / "spec" / "amqp-rabbitmq-0.9.1.json"
GENERATED = ROOT / "src" / "rabbitry" / "protocol" / "spec.py"


@pytest.fixture
def spec_json() -> Path:
    """The generator's input. Missing, the drift checks fail (a skip would hide drift)."""
    if not SPEC_JSON.exists():
        pytest.fail(
            f"RabbitMQ's machine-readable spec is not at {SPEC_JSON} (the generator's "
            "input); deselect these tests explicitly to run without it",
            pytrace=False,
        )
    return SPEC_JSON


needs_json = pytest.mark.usefixtures("spec_json")

ALL_METHODS = sorted(spec.METHODS.values(), key=lambda cls: cls.INDEX)


def run_generator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATOR), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@needs_json
def test_generated_spec_is_up_to_date() -> None:
    result = run_generator("--check")
    assert result.returncode == 0, result.stderr


@needs_json
def test_check_detects_drift(tmp_path: Path) -> None:
    copy = tmp_path / "spec.py"
    shutil.copyfile(GENERATED, copy)
    assert run_generator("--check", "--output", str(copy)).returncode == 0
    copy.write_text(copy.read_text() + "# hand edit\n")
    result = run_generator("--check", "--output", str(copy))
    assert result.returncode == 1
    assert "out of date" in result.stderr


# --------------------------------------------------------------------------- vs the JSON


def load_json() -> dict[str, Any]:
    return json.loads(SPEC_JSON.read_text())  # type: ignore[no-any-return]


def resolve(domains: dict[str, str], arg: dict[str, Any]) -> str:
    kind: str = arg.get("type") or arg["domain"]
    while kind in domains and domains[kind] != kind:
        kind = domains[kind]
    return kind


def json_methods() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    if not SPEC_JSON.exists():
        return []
    return [(c, m) for c in load_json()["classes"] for m in c["methods"]]


@needs_json
def test_every_json_method_is_generated_and_nothing_else() -> None:
    expected = {(c["id"] << 16) | m["id"] for c, m in json_methods()}
    assert set(spec.METHODS) == expected


@needs_json
@pytest.mark.parametrize(
    ("amqp_class", "method"),
    json_methods(),
    ids=lambda value: value["name"],
)
def test_method_matches_json(amqp_class: dict[str, Any], method: dict[str, Any]) -> None:
    domains = {name: kind for name, kind in load_json()["domains"]}
    cls = spec.METHODS[(amqp_class["id"] << 16) | method["id"]]
    assert cls.NAME == f"{amqp_class['name']}.{method['name']}"
    assert (cls.CLASS_ID, cls.METHOD_ID) == (amqp_class["id"], method["id"])
    assert cls.SYNCHRONOUS == bool(method.get("synchronous"))
    assert cls.CONTENT == bool(method.get("content"))
    names = [a["name"].replace("-", "_") for a in method["arguments"]]
    names = [n + "_" if keyword.iskeyword(n) else n for n in names]
    assert list(cls.FIELDS) == names
    assert list(cls.FIELD_TYPES) == [resolve(domains, a) for a in method["arguments"]]


@needs_json
def test_properties_match_json() -> None:
    data = load_json()
    domains = {name: kind for name, kind in data["domains"]}
    [basic] = [c for c in data["classes"] if c["name"] == "basic"]
    names = [p["name"].replace("-", "_") for p in basic["properties"]]
    assert list(spec.BasicProperties.FIELDS) == names
    assert list(spec.BasicProperties.FIELD_TYPES) == [
        resolve(domains, p) for p in basic["properties"]
    ]


@needs_json
def test_constants_match_json() -> None:
    data = load_json()
    assert spec.PORT == data["port"] == 5672
    assert spec.VERSION == (0, 9, 1)
    for const in data["constants"]:
        assert getattr(spec, const["name"].replace("-", "_")) == const["value"], const["name"]
    assert spec.FRAME_END == frames.FRAME_END == 0xCE
    assert spec.FRAME_MIN_SIZE == frames.FRAME_MIN_SIZE


def test_reply_codes_are_reply_codes() -> None:
    assert all(200 <= code < 600 for code in spec.REPLY_CODES)


def test_reply_codes_classes() -> None:
    assert spec.REPLY_CODES[200] == ("REPLY-SUCCESS", "")
    assert spec.REPLY_CODES[404] == ("NOT-FOUND", "soft-error")
    assert spec.REPLY_CODES[320] == ("CONNECTION-FORCED", "hard-error")
    assert spec.REPLY_CODES[540] == ("NOT-IMPLEMENTED", "hard-error")


# --------------------------------------------------------------------------- structure


def test_indexes_are_unique_and_consistent() -> None:
    indexes = [cls.INDEX for cls in spec.METHODS.values()]
    assert len(indexes) == len(set(indexes))
    names = [cls.NAME for cls in spec.METHODS.values()]
    assert len(names) == len(set(names))
    for index, cls in spec.METHODS.items():
        assert issubclass(cls, Method)
        assert index == cls.INDEX == (cls.CLASS_ID << 16) | cls.METHOD_ID
        assert cls.PREFIX == struct.pack(">HH", cls.CLASS_ID, cls.METHOD_ID)
        assert len(cls.FIELDS) == len(cls.FIELD_TYPES)
        assert spec.method_name(cls.CLASS_ID, cls.METHOD_ID) == cls.NAME
    assert spec.method_name(60, 999) == "60.999"


#: Synchronous requests the client sends, and what must answer them.
CLIENT_REQUESTS = {
    "connection.open": {"connection.open-ok"},
    "connection.close": {"connection.close-ok"},
    "connection.update-secret": {"connection.update-secret-ok"},
    "channel.open": {"channel.open-ok"},
    "channel.flow": {"channel.flow-ok"},
    "channel.close": {"channel.close-ok"},
    "exchange.declare": {"exchange.declare-ok"},
    "exchange.delete": {"exchange.delete-ok"},
    "exchange.bind": {"exchange.bind-ok"},
    "exchange.unbind": {"exchange.unbind-ok"},
    "queue.declare": {"queue.declare-ok"},
    "queue.bind": {"queue.bind-ok"},
    "queue.purge": {"queue.purge-ok"},
    "queue.delete": {"queue.delete-ok"},
    "queue.unbind": {"queue.unbind-ok"},
    "basic.qos": {"basic.qos-ok"},
    "basic.consume": {"basic.consume-ok"},
    "basic.cancel": {"basic.cancel-ok"},
    "basic.get": {"basic.get-ok", "basic.get-empty"},
    "basic.recover": {"basic.recover-ok"},
    "tx.select": {"tx.select-ok"},
    "tx.commit": {"tx.commit-ok"},
    "tx.rollback": {"tx.rollback-ok"},
    "confirm.select": {"confirm.select-ok"},
}
BY_NAME = {cls.NAME: cls for cls in spec.METHODS.values()}


@pytest.mark.parametrize(("name", "answers"), sorted(CLIENT_REQUESTS.items()))
def test_client_requests_are_synchronous_with_responses(name: str, answers: set[str]) -> None:
    cls = BY_NAME[name]
    assert cls.SYNCHRONOUS
    assert cls.RESPONSES, f"{name} has no RESPONSES"
    assert {response.NAME for response in cls.RESPONSES} == answers


def test_every_synchronous_method_has_responses_of_its_class() -> None:
    for cls in ALL_METHODS:
        if cls.SYNCHRONOUS:
            assert cls.RESPONSES, cls.NAME
        for response in cls.RESPONSES:
            assert response.CLASS_ID == cls.CLASS_ID, cls.NAME
            assert not response.SYNCHRONOUS, (cls.NAME, response.NAME)
            assert response in spec.METHODS.values()


def test_asynchronous_methods_have_no_responses() -> None:
    for cls in ALL_METHODS:
        if not cls.SYNCHRONOUS:
            assert cls.RESPONSES == (), cls.NAME


def test_content_methods() -> None:
    assert {cls.NAME for cls in ALL_METHODS if cls.CONTENT} == {
        "basic.publish",
        "basic.return",
        "basic.deliver",
        "basic.get-ok",
    }


def test_all_exports_exist() -> None:
    for name in spec.__all__:
        assert hasattr(spec, name), name
    for name in frames.__all__:
        assert hasattr(frames, name), name

"""``bench/spark_bench.py`` (``make bench-spark``) without Spark or a broker: its arguments,
the targets it measures and the table it prints. A run itself needs a JVM start (about a
minute here), too slow for a test; docs/benchmarks.md ("Spark") has one run's table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "spark_bench.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["spark_bench"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["spark_bench"]
    return module


def test_defaults_are_100k_rows_of_128_bytes_on_local_2_then_a_two_worker_cluster(
    bench: ModuleType,
) -> None:
    options = bench.parse_args([])
    assert (options.rows, options.body_bytes, options.partitions) == (100_000, 128, (2, 4))
    assert (options.batch, options.master, options.url) == (25_000, "local[2]", None)
    assert options.cluster == 2
    assert bench.parse_args(["--cluster", "0"]).cluster == 0
    # The remote-broker row: super streams of 1, 2 and 4 partitions through a proxy
    # adding 2 ms each way, on a master with a task slot per partition.
    assert (options.remote_ms, options.remote_partitions) == (2.0, (1, 2, 4))
    assert (options.remote_master, options.remote_only) == ("local[4]", False)
    assert bench.parse_args(["--remote-ms", "0"]).remote_ms == 0
    quick = bench.parse_args(["--remote-only", "--remote-partitions", "1,8"])
    assert (quick.remote_only, quick.remote_partitions) == (True, (1, 8))
    labels = [t.label for t in bench.targets(options)]
    assert labels == [
        "classic queue",
        "stream queue",
        "super stream, 2 partitions",
        "super stream, 4 partitions",
    ]


def test_options_scale_a_quick_run(bench: ModuleType) -> None:
    options = bench.parse_args(
        ["--rows", "10_000", "--body-bytes", "16", "--partitions", "3", "--batch", "65535"]
    )
    assert (options.rows, options.body_bytes, options.partitions, options.batch) == (
        10_000,
        16,
        (3,),
        65535,
    )
    assert [t.partitions for t in bench.targets(options)] == [0, 0, 3]
    assert bench.parse_args(["--partitions", "1, 8"]).partitions == (1, 8)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--rows", "0"], "--rows"),
        (["--rows", "many"], "--rows"),
        (["--body-bytes", "-1"], "--body-bytes"),
        (["--partitions", "0"], "--partitions"),
        (["--partitions", "2,x"], "--partitions"),
        (["--partitions", "2,2"], "--partitions"),
        (["--partitions", ","], "--partitions"),
        (["--batch", "65536"], "--batch"),
        (["--master", " "], "--master"),
        (["--cluster", "-1"], "--cluster"),
        (["--cluster", "two"], "--cluster"),
        (["--remote-ms", "-1"], "--remote-ms"),
        (["--remote-ms", "far"], "--remote-ms"),
        (["--remote-partitions", "0"], "--remote-partitions"),
        (["--remote-master", ""], "--remote-master"),
        (["--remote-only", "--remote-ms", "0"], "--remote-only"),
    ],
)
def test_a_bad_value_exits_2_naming_the_option(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(argv)
    assert exited.value.code == 2
    assert f"argument {named}" in capsys.readouterr().err


def test_the_table_gives_each_rate_and_its_ratio_to_the_broker(bench: ModuleType) -> None:
    reference = bench.Result("broker", 20_000.0, 40_000.0)
    results = [
        bench.Result("classic queue", 10_000.0, 5_000.0, 8_000.0, 4),
        bench.Result("super stream, 2 partitions", 30_000.0, 400.0, None, 1),
    ]
    text = bench.render(reference, results, ["100 rows", "load 1.0"])
    lines = text.splitlines()
    assert lines[:3] == ["100 rows", "load 1.0", ""]
    assert lines[5] == "| broker | 20.0k | 1.00 | 40.0k | 1.00 | - | - |"
    assert lines[6] == "| classic queue | 10.0k | 0.50 | 5.0k | 0.12 | 8.0k | 4 |"
    assert lines[7] == "| super stream, 2 partitions | 30.0k | 1.50 | 400 | 0.01 | - | 1 |"
    assert len(lines) == 8


def test_each_super_stream_is_compared_with_the_stream_read_on_the_same_master(
    bench: ModuleType,
) -> None:
    reference = bench.Result("broker", 20_000.0, 40_000.0)
    results = [
        bench.Result("local[2]: stream queue", 10_000.0, 10_000.0),
        bench.Result("local[2]: super stream, 2 partitions", 10_000.0, 12_000.0),
        bench.Result("cluster of 2: stream queue", 10_000.0, 8_000.0),
        bench.Result("cluster of 2: super stream, 2 partitions", 10_000.0, 14_000.0),
        bench.Result("cluster of 2: super stream, 4 partitions", 10_000.0, 16_000.0),
    ]
    lines = bench.render(reference, results, ["header"]).splitlines()
    assert lines[-4:] == [
        "",
        "* local[2]: super stream, 2 partitions: read ÷ the stream queue's read 1.20",
        "* cluster of 2: super stream, 2 partitions: read ÷ the stream queue's read 1.75",
        "* cluster of 2: super stream, 4 partitions: read ÷ the stream queue's read 2.00",
    ]


def test_the_remote_row_gives_each_partition_count_its_ratio_to_one_and_cpu_per_row(
    bench: ModuleType,
) -> None:
    results = [
        bench.RemoteResult(1, 5_000.0, 120.0, 6_000.0, 4),
        bench.RemoteResult(2, 9_500.0, 110.5, None, 4),
        bench.RemoteResult(4, 16_000.0, 101.25, 20_000.0, 3),
    ]
    lines = bench.render_remote(results, 2.0, "local[4]").splitlines()
    assert "2 ms each way, on local[4]" in lines[0]
    assert lines[4:] == [
        "| 1 | 5.0k | 1.00 | 6.0k | 120.0 | 4 |",
        "| 2 | 9.5k | 1.90 | - | 110.5 | 4 |",
        "| 4 | 16.0k | 3.20 | 20.0k | 101.2 | 3 |",
    ]

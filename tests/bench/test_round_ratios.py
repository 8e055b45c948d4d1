"""The per-round ratios the side-by-side benchmarks print under their tables (make bench-vs-pulsar):
each round's run of a tc-server is divided by the same round's run of Pulsar, never by another round's."""

from __future__ import annotations

import math

from tc_server.bench import txn_java, vs_pulsar
from tc_server.bench.java_load import Run, ratios_by_round, round_ratios_text


def _run(server: str, concurrency: int, rate: float, cpu: float) -> Run:
    return Run(server=server, concurrency=concurrency, pairs_per_s=rate, pair_p50_ms=1.0, pair_p99_ms=2.0,
               server_cpu_us_per_pair=cpu, errors=0)


def _rounds() -> list[Run]:
    """The order java_load.alternated() produces for two targets: round 0 Pulsar first, round 1 reversed;
    the machine was fast in round 0 and slow in round 1."""
    return [
        _run("pulsar", 64, 5000, 200), _run("tc", 64, 4500, 180),   # round 0, fast
        _run("tc", 64, 3000, 300), _run("pulsar", 64, 3500, 320),   # round 1, slow
        _run("pulsar", 16, 1000, 600), _run("tc", 16, 2000, 300),   # another concurrency, one round
    ]


def test_each_ratio_pairs_runs_of_the_same_round() -> None:
    assert ratios_by_round(_rounds(), "tc", "pulsar", 64, "pairs_per_s") == [0.9, 3000 / 3500]
    assert ratios_by_round(_rounds(), "tc", "pulsar", 64, "server_cpu_us_per_pair") == [0.9, 300 / 320]
    assert ratios_by_round(_rounds(), "tc", "pulsar", 16, "pairs_per_s") == [2.0]


def test_a_zero_baseline_gives_nan_not_a_crash() -> None:
    runs = [_run("pulsar", 64, 0, 0), _run("tc", 64, 10, 10)]
    assert math.isnan(ratios_by_round(runs, "tc", "pulsar", 64, "pairs_per_s")[0])


def test_the_printed_line_names_both_servers_and_every_round() -> None:
    line = round_ratios_text(_rounds(), "tc", "pulsar", 64, vs_pulsar.ROUND_FIELDS)
    assert line == ("tc / pulsar at 64 in flight, round by round: pairs/s 0.90x 0.86x; p99 1.00x 1.00x; "
                    "server CPU/pair 0.90x 0.94x")


def test_vs_pulsar_summary_prints_the_rounds_under_the_table(capsys) -> None:
    vs_pulsar.summary(_rounds(), [16, 64], ["tc"])  # type: ignore[arg-type]  # java_load.Run suffices here
    table, below = capsys.readouterr().out.strip("\n").split("\n\n")
    # The table keeps the ratio of the medians (3,750 / 4,250): a fast round's run against a slow one's.
    assert table.splitlines()[-1] == "| 64 | tc / Pulsar | 0.88x | 1.00x | 1.00x | 0.92x |"
    assert below.splitlines() == [
        "tc / pulsar at 16 in flight, round by round: pairs/s 2.00x; p99 1.00x; server CPU/pair 0.50x",
        "tc / pulsar at 64 in flight, round by round: pairs/s 0.90x 0.86x; p99 1.00x 1.00x; "
        "server CPU/pair 0.90x 0.94x",
    ]


def test_txn_java_summary_prints_each_tc_server_round_by_round(capsys) -> None:
    def run(server: str, rate: float) -> txn_java.Run:
        return txn_java.Run(server=server, concurrency=64, pairs_per_s=rate, pair_p50_ms=1.0, pair_p99_ms=4.0,
                            server_cpu_us_per_pair=500, errors=0, commit_p50_ms=1.0, commit_p99_ms=2.0)

    txn_java.summary([run(txn_java.PULSAR, 1000), run(txn_java.TC_DIRECT, 900), run(txn_java.TC_SERVER, 1100)], [64])
    below = capsys.readouterr().out.strip("\n").split("\n\n")[1]
    assert below.splitlines() == [
        f"{txn_java.TC_DIRECT} / pulsar at 64 in flight, round by round: pairs/s 0.90x; p99 1.00x; commit p99 1.00x",
        f"{txn_java.TC_SERVER} / pulsar at 64 in flight, round by round: pairs/s 1.10x; p99 1.00x; commit p99 1.00x",
    ]

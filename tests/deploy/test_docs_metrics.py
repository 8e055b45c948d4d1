"""Every metric the prose docs name (README.md and docs/*.md, but the measurement log) is one tc-server
exports, with the labels the docs give it: an operator copies these names into PromQL queries, and a
wrong one answers with an empty result that reads as "nothing happened". (The dashboard and the alert
rules have tests of their own: test_dashboard.py, test_alerts.py.)"""

from __future__ import annotations

import itertools
import re

from tc_server.config import Settings
from tc_server.supervisor import Supervisor

from .manifests import ROOT, SUFFIXES, exported_families

DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "performance.md")]

# A name, maybe with {a,b} alternatives inside it, then maybe {label,...} or {label="v"} matchers.
NAME = re.compile(r"\b((?:tc_server|pulsar_txn)_(?:[a-z0-9_]*_)?\{[a-z0-9_,\s]+\}?[a-z0-9_]*"
                  r"|(?:tc_server|pulsar_txn)_[a-z0-9_]*)(\{[^}`]*\})?")


def documentable_names() -> dict[str, frozenset[str]]:
    """Each name the docs may use (a family's, a histogram's base, each sample's) -> its label names, over
    one instance's families and those of the supervisor of --workers N."""
    families = {name.removesuffix("_total") if kind == "counter" else name: (kind, labels)
                for name, (kind, labels) in exported_families().items()}
    for family in Supervisor(Settings(workers=2), [])._registry.collect():  # noqa: SLF001
        labels = frozenset(itertools.chain.from_iterable(sample.labels for sample in family.samples))
        families.setdefault(family.name, (family.type, labels))
    return {base + suffix: labels for base, (kind, labels) in families.items() for suffix in ("", *SUFFIXES[kind])}


def expand(name: str) -> list[str]:
    """pulsar_txn_{created,committed}_total -> both names."""
    match = re.search(r"\{([^}]*)\}?", name)
    if match is None:
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    return [n for alt in match.group(1).split(",") if alt.strip() for n in expand(head + alt.strip() + tail)]


def mentions() -> list[tuple[str, str, list[str]]]:
    """(file:line, metric name, label names given) for every metric the docs name."""
    found = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for raw, labels in NAME.findall(line):
                given = re.findall(r"([a-z_]+)\s*(?:[!=]~?|,|\}|$)", labels.strip("{}") + "}") if labels else []
                found += [(f"{path.relative_to(ROOT)}:{number}", name, given) for name in expand(raw)]
    return found


def test_the_docs_name_metrics_at_all() -> None:
    assert len(mentions()) > 30
    assert expand("pulsar_txn_{created,committed}_total") == ["pulsar_txn_created_total",
                                                               "pulsar_txn_committed_total"]


def test_every_metric_the_docs_name_is_exported() -> None:
    names = documentable_names()
    missing = [f"{where}: {name}" for where, name, _ in mentions() if name not in names]
    assert not missing, "the docs name metrics tc-server never exports:\n" + "\n".join(missing)


def test_every_label_the_docs_give_a_metric_is_one_of_its_labels() -> None:
    names = documentable_names()
    wrong = [f"{where}: {name}{{{','.join(given)}}} has labels {sorted(names[name])}"
             for where, name, given in mentions() if name in names and not set(given) <= names[name]]
    assert not wrong, "\n".join(wrong)

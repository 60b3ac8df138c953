"""The Grafana dashboard only queries metrics the service really exports."""

import json
import re
from pathlib import Path

from app.engine.engine_stats import EngineStats
from app.host.stats import AdmissionStats, ReplicaStats
from app.http.metrics import Metrics, _Snapshot
from app.http.tenant_accounts import TenantAccounts
from app.tenancy import Tenant

DASHBOARD = Path(__file__).resolve().parents[2] / "configs" / "grafana-dashboard.json"
STATS = {"m": {"r1": ReplicaStats(
    model="m", ready=True, healthy=True, kv_cache_tokens=1, engine=EngineStats(),
    admission=AdmissionStats(running=0, waiting=0, in_system=0, tokens_in_use=0, token_budget=1, peak_waiting=0,
                             refused_queue_full=0, refused_queue_timeout=0, refused_over_time_target=0,
                             predicted_first_token_s=None))}}


def _exported_names() -> set[str]:
    accounts = TenantAccounts()
    accounts.of(Tenant("t")).prompt_tokens = 1
    text = Metrics().render(STATS, extra=[accounts]).decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name)
            if kind == "counter":
                names.add(name + "_total")
            if kind == "histogram":
                names |= {name + "_bucket", name + "_count", name + "_sum"}
    return names


def test_every_dashboard_query_uses_an_exported_metric():
    exported = _exported_names()
    dashboard = json.loads(DASHBOARD.read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\b((?:app_|vllm:)[A-Za-z0-9_:]+)\{", target["expr"]))
    assert used, "the dashboard queries nothing"
    assert used <= exported, f"not exported: {sorted(used - exported)}"


def test_engine_snapshot_is_labelled_by_model_and_replica():
    families = list(_Snapshot(STATS).collect())
    assert families and all(s.labels == {"model_name": "m", "replica": "r1"} for f in families for s in f.samples)

"""What the builder hands Ray Serve for an engine deployment: the router and the per-node placement."""

from __future__ import annotations

import pytest

from app.builder import build_from_config
from app.serving_router import ROUTING_STATS_PERIOD_S, ServingReplicaRouter
from tests.support.fake_stack import make_config


@pytest.mark.parametrize("per_node", [None, 1])
def test_engine_deployments_get_the_serving_router_and_the_per_node_limit(per_node):
    config = make_config(deployment={"num_replicas": 2, "max_replicas_per_node": per_node})
    deployment = build_from_config(config)._bound_deployment
    router = deployment._deployment_config.request_router_config
    assert router.get_request_router_class() is ServingReplicaRouter
    assert router.request_routing_stats_period_s == ROUTING_STATS_PERIOD_S
    assert deployment._replica_config.max_replicas_per_node == per_node

"""What the builder hands Ray Serve: the topology (one replica serves HTTP itself; several get the ingress tier),
and for an engine deployment the router and the per-node placement."""

from __future__ import annotations

import pytest

from app.rayserve.builder import INGRESS_NAME, build_from_config, engine_deployment_name
from app.rayserve.request_router import ROUTING_STATS_PERIOD_S, ServingReplicaRouter
from tests.support.fake_stack import make_config


def _engine_behind_the_ingress(app):
    ingress = app._bound_deployment
    assert ingress.name == INGRESS_NAME
    (engine,) = ingress._replica_config.init_args[1].values()
    return engine._bound_deployment


def test_one_replica_serves_http_itself_and_several_get_the_ingress_tier():
    single = make_config()
    assert build_from_config(single)._bound_deployment.name == engine_deployment_name(single.models[0].id)
    engine = _engine_behind_the_ingress(build_from_config(make_config(deployment={"num_replicas": 2})))
    assert engine.num_replicas == 2
    assert _engine_behind_the_ingress(build_from_config(make_config(service={"colocate_ingress": False})))


@pytest.mark.parametrize("per_node", [None, 1])
def test_engine_deployments_get_the_serving_router_and_the_per_node_limit(per_node):
    config = make_config(deployment={"num_replicas": 2, "max_replicas_per_node": per_node})
    deployment = _engine_behind_the_ingress(build_from_config(config))
    router = deployment._deployment_config.request_router_config
    assert router.get_request_router_class() is ServingReplicaRouter
    assert router.request_routing_stats_period_s == ROUTING_STATS_PERIOD_S
    assert deployment._replica_config.max_replicas_per_node == per_node

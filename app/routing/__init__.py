"""Fleet routing: which replica of a model answers a request (fleet_router.py). No Ray, no HTTP: the Serve request
router (rayserve/request_router.py) and the ingress's handle adapter (rayserve/handle_backend.py) use it."""

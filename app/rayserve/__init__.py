"""Ray Serve wiring: the replica classes, the app builder, the handle backend with its retries, moving a
request's unfinished answer to another replica, and the request router."""

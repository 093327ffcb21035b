"""The cluster's collector: the headless core every front end builds (core.py), the one writer's lock
(lock.py), the socket viewers attach to (server.py, wire.py) and the viewer's side of it (attach.py)."""

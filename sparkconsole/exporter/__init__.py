"""The Prometheus exporter: the console's readings (nodes, OOM guards, containers, endpoints, alerts) as /metrics.

readings.py owns the monitors and feeds the alert engine; collector.py turns the last readings into metric
families (prometheus_client, no I/O: a scrape never waits on a node); server.py serves them over HTTP;
listen.py is the bind-address and token policy shared with `sparkconsole serve`; webconfig.py (TLS and basic auth
from a web config file), access.py (token or basic auth) and listener.py (the two together, `make_listener`) are
what every listener shares, listenargs.py their command-line options.
"""

"""`sparkconsole serve`: the console in a browser tab (textual-serve), behind a token off loopback, read-only on
request (and by default off loopback)."""

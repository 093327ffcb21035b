"""Models and images onto every node (issue 18): `sparkconsole model …` and `sparkconsole image …`.

- nodescript.py: the stdlib-only program run on a node (`python3 -c`) for the Hugging Face cache: list,
  manifest, staged write/read, commit (atomic rename), remove.
- relay.py: a binary pipe from a command on one node to a command on another, through this machine's SSH
  connections, with byte counts (progress, ETA) and cancellation that ends both remote commands.
- models.py: list / pull (download with `hf download` on one node, then copy) / rm.
- images.py: list / pull (`docker save | docker load` to the nodes that lack the image) / rm.
- progress.py: rate and ETA, and the terminal line the commands print.

Nothing a launch would take for complete is ever half-written: a model is copied or downloaded into
`<hub>/.sparkconsole-partial/models--…` (same filesystem) and renamed into the hub only once every file has its
full size; an image exists for `docker` only once `docker load` has read the whole archive.
"""

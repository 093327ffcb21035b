"""Which transport reaches a node: this machine directly (nodes/transport.py) or one persistent SSH connection
(nodes/ssh.py). Above both, so that neither imports the other's module."""

from __future__ import annotations

from ..config import NodeConfig, SshPolicy
from .transport import ConfirmNewHost, LocalTransport, Transport


def make_transport(node: NodeConfig, policy: SshPolicy, *, confirm_new_host: ConfirmNewHost | None = None) -> Transport:
    if node.local:
        return LocalTransport(node)
    from .ssh import SshTransport  # asyncssh is imported only by a cluster that has a remote node
    return SshTransport(node, policy, confirm_new_host=confirm_new_host)

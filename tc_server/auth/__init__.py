"""Who a peer is and what it may do: authentication providers (``token``, ``tls``) behind one
Protocol, the service that picks one by method name, superuser roles, the server's TLS context
(reloaded when its files change) and the credentials tc-server presents to brokers.

Nothing here knows the wire protocol or HTTP: the Pulsar handshake (tc_server/server/handshake.py)
and the admin port (tc_server/admin) hand over what the client presented and get a role back.
docs/security.md describes the model.
"""

from tc_server.auth.api import (
    Authenticated,
    AuthenticationData,
    AuthenticationFailed,
    AuthenticationProvider,
)
from tc_server.auth.service import AuthenticationService

__all__ = [
    "Authenticated",
    "AuthenticationData",
    "AuthenticationFailed",
    "AuthenticationProvider",
    "AuthenticationService",
]

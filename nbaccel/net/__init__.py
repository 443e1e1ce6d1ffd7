"""The authenticated link between the kernel and node agents, used by both sides: signed frames
(``signing``), the connection and its handshake (``link``) and the message names (``protocol``).
Nothing read from a network is unpickled before its signature is checked."""

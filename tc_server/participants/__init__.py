"""Today's brokers as participants (PIP-31): tc-server tells them its decisions (docs/participants.md)."""

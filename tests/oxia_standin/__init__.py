"""A STAND-IN for the Oxia server, for tests only (see server.py for why it exists)."""

"""tc-server: a standalone Apache Pulsar transaction coordinator."""

"""Similar historical market states: ingest, embed, store, serve (JSON-RPC 2.0)."""

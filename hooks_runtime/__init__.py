"""The hook sandbox: restricted compile, worker process, IPC protocol and pool."""

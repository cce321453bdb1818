"""A worker process and what crosses its boundary: the process loop, the message protocol, the KV
transport between workers, and the launcher that places processes. May import checkpoint and below."""

"""The chat socket: the consumer (frames in, frames out through one outbox) and its plumbing."""

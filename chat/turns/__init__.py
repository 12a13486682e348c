"""Chat turns: starting one from an admitted frame, running it, and following it from anywhere."""

"""Where a message waits for its slot without a thread: the gate, parking, places in line."""

"""Per-process state of a worker: claims, the heartbeat, wake-ups, lingering holds, interrupts."""

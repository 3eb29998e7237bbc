"""`specdec soak`: many concurrent clients against the real services while faults are
injected. cli (the command and the run), load (the traffic), faults (the topology and the
faults), report (the verdict and its figures)."""

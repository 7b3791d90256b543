"""rttsched: RTT-aware scheduling for heterogeneous GPU/CPU Kubernetes clusters."""

__version__ = "0.1.0"

"""The lab: emulated NVIDIA GPU hosts in network + mount namespaces, reached over real SSH (see docs/lab.md)."""
